package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/verify"
)

// Client talks to a ledgerd over its REST API. Errors the server reports
// come back as *ledger.Error with the contract's code.
type Client struct {
	BaseURL string
	HTTP    *http.Client // default http.DefaultClient
	Token   string       // bearer token, if the server requires one
	// Namespace is the namespace the client works in; "" or default use
	// the unprefixed routes (SPEC §7).
	Namespace string
}

// nsPath turns a /v1 path into the client's namespace's form.
func (c *Client) nsPath(path string) string {
	if c.Namespace == "" || c.Namespace == ledger.DefaultNamespace || !strings.HasPrefix(path, "/v1/") {
		return path
	}
	return "/v1/ns/" + url.PathEscape(c.Namespace) + strings.TrimPrefix(path, "/v1")
}

// logPath is the tlog-tiles prefix of the client's namespace.
func (c *Client) logPath() string {
	ns := c.Namespace
	if ns == "" {
		ns = ledger.DefaultNamespace
	}
	return "/log/" + url.PathEscape(ns) + "/"
}

// NewClient returns a Client for the server at baseURL.
func NewClient(baseURL string) *Client {
	return &Client{BaseURL: strings.TrimRight(baseURL, "/")}
}

// StatusError is an error response; it unwraps to the *ledger.Error.
type StatusError struct {
	Status int
	Err    *ledger.Error
}

func (e *StatusError) Error() string { return fmt.Sprintf("server: %d %s", e.Status, e.Err.Error()) }

// Unwrap returns the contract error.
func (e *StatusError) Unwrap() error { return e.Err }

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		rd = strings.NewReader(string(b))
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+c.nsPath(path), rd)
	if err != nil {
		return fmt.Errorf("request: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	res, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer func() { _ = res.Body.Close() }()
	data, err := io.ReadAll(io.LimitReader(res.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("%s %s: read response: %w", method, path, err)
	}
	if res.StatusCode >= 400 {
		var eb struct {
			Error struct {
				Code    string         `json:"code"`
				Message string         `json:"message"`
				Details map[string]any `json:"details"`
			} `json:"error"`
		}
		if json.Unmarshal(data, &eb) != nil || eb.Error.Code == "" {
			eb.Error.Code, eb.Error.Message = ledger.ECodeInternal, strings.TrimSpace(string(data))
		}
		return &StatusError{Status: res.StatusCode, Err: &ledger.Error{Code: eb.Error.Code,
			Message: eb.Error.Message, Details: eb.Error.Details}}
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%s %s: decode response: %w", method, path, err)
		}
	}
	return nil
}

// Head returns the chain head.
func (c *Client) Head(ctx context.Context) (ledger.Head, error) {
	var b receiptRef
	if err := c.do(ctx, http.MethodGet, "/v1/head", nil, &b); err != nil {
		return ledger.Head{}, err
	}
	h, err := chain.ParseHash(b.Hash)
	if err != nil {
		return ledger.Head{}, fmt.Errorf("head: %w", err)
	}
	return ledger.Head{Seq: b.Seq, Hash: h}, nil
}

// ListReceipts returns one page of receipts (GET /v1/receipts).
func (c *Client) ListReceipts(ctx context.Context, f ledger.ReceiptFilter) ([]chain.Receipt, *uint64, error) {
	q := url.Values{}
	q.Set("after", strconv.FormatUint(f.After, 10))
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	for name, v := range map[string]string{"key": f.Key, "execution_id": f.ExecutionID, "tool": f.Tool, "kind": f.Kind} {
		if v != "" {
			q.Set(name, v)
		}
	}
	var b struct {
		Receipts  []chain.Receipt `json:"receipts"`
		NextAfter *uint64         `json:"next_after"`
	}
	if err := c.do(ctx, http.MethodGet, "/v1/receipts?"+q.Encode(), nil, &b); err != nil {
		return nil, nil, err
	}
	return b.Receipts, b.NextAfter, nil
}

// Receipts pages through every receipt with seq > after, in seq order
// (verify.Remote).
func (c *Client) Receipts(ctx context.Context, after uint64, fn func(*chain.Receipt) error) error {
	return c.each(ctx, ledger.ReceiptFilter{After: after, Limit: ledger.MaxPageLimit}, fn)
}

// KeyHistory pages through one key's receipts in seq order
// (verify.Remote).
func (c *Client) KeyHistory(ctx context.Context, key string, fn func(*chain.Receipt) error) error {
	return c.each(ctx, ledger.ReceiptFilter{Key: key, Limit: ledger.MaxPageLimit}, fn)
}

// A Client is what an online verification reads.
var _ verify.Remote = (*Client)(nil)

func (c *Client) each(ctx context.Context, f ledger.ReceiptFilter, fn func(*chain.Receipt) error) error {
	for {
		rs, next, err := c.ListReceipts(ctx, f)
		if err != nil {
			return err
		}
		for i := range rs {
			if err := fn(&rs[i]); err != nil {
				return err
			}
		}
		if next == nil || len(rs) == 0 {
			return nil
		}
		f.After = *next
	}
}

// GetKey returns a key's state, expiry and the current generation's
// receipts (with history, every receipt of the key).
func (c *Client) GetKey(ctx context.Context, key string, history bool) (*ledger.KeyView, error) {
	path := "/v1/effects/" + url.PathEscape(key)
	if history {
		path += "?history=true"
	}
	var b keyBody
	if err := c.do(ctx, http.MethodGet, path, nil, &b); err != nil {
		return nil, err
	}
	return &ledger.KeyView{IdempotencyKey: b.IdempotencyKey, State: ledger.State(b.State), Tool: b.Tool,
		Effect: b.Effect, Idempotent: b.Idempotent, InputHash: b.InputHash, ExpiresAt: b.ExpiresAt,
		Receipts: b.Receipts}, nil
}

// ResolveBody is the request of POST /v1/effects/{key}/resolve.
type ResolveBody struct {
	Outcome     string          `json:"outcome"`
	ExternalRef string          `json:"external_ref,omitempty"`
	Result      json.RawMessage `json:"result,omitempty"`
	Error       *FailureBody    `json:"error,omitempty"`
	Note        string          `json:"note"`
}

// FailureBody is the "error" member of a commit or resolve.
type FailureBody struct {
	Code      string `json:"code"`
	Message   string `json:"message,omitempty"`
	Retryable bool   `json:"retryable,omitempty"`
}

// Resolve records an operator's decision about an interrupted key.
func (c *Client) Resolve(ctx context.Context, key string, body ResolveBody) (*ledger.ResolveResult, error) {
	var b resolvedBody
	if err := c.do(ctx, http.MethodPost, "/v1/effects/"+url.PathEscape(key)+"/resolve", body, &b); err != nil {
		return nil, err
	}
	h, err := chain.ParseHash(b.Receipt.Hash)
	if err != nil {
		return nil, fmt.Errorf("resolve: %w", err)
	}
	return &ledger.ResolveResult{IdempotencyKey: b.IdempotencyKey, State: ledger.State(b.State),
		Receipt: ledger.ReceiptRef{Seq: b.Receipt.Seq, Hash: h}}, nil
}

// CreateNamespace creates the namespace name whose keys expire after
// keyTTL ms, 0 never (POST /v1/namespaces; an admin token when tokens
// exist), and returns it with its empty head.
func (c *Client) CreateNamespace(ctx context.Context, name string, keyTTL uint64) (ledger.NamespaceInfo, error) {
	var b namespaceJSON
	body := map[string]any{"name": name}
	if keyTTL != 0 {
		body["key_ttl_ms"] = keyTTL
	}
	if err := c.do(ctx, http.MethodPost, "/v1/namespaces", body, &b); err != nil {
		return ledger.NamespaceInfo{}, err
	}
	return b.info()
}

// Namespaces lists the namespaces with their heads (GET /v1/namespaces;
// a token limited to namespaces sees only those).
func (c *Client) Namespaces(ctx context.Context) ([]ledger.NamespaceInfo, error) {
	var b struct {
		Namespaces []namespaceJSON `json:"namespaces"`
	}
	if err := c.do(ctx, http.MethodGet, "/v1/namespaces", nil, &b); err != nil {
		return nil, err
	}
	out := make([]ledger.NamespaceInfo, 0, len(b.Namespaces))
	for _, n := range b.Namespaces {
		info, err := n.info()
		if err != nil {
			return nil, err
		}
		out = append(out, info)
	}
	return out, nil
}

// KeyTTL returns the key_ttl_ms of the client's namespace, as listed by
// GET /v1/namespaces (SPEC §12): what an online verifier applies.
func (c *Client) KeyTTL(ctx context.Context) (uint64, error) {
	root := *c
	root.Namespace = "" // the list is served unprefixed
	list, err := root.Namespaces(ctx)
	if err != nil {
		return 0, err
	}
	ns := c.Namespace
	if ns == "" {
		ns = ledger.DefaultNamespace
	}
	for _, n := range list {
		if n.Name == ns {
			return n.KeyTTL, nil
		}
	}
	return 0, fmt.Errorf("key ttl: the server does not list namespace %q", ns)
}

// info converts a namespace of the API to the domain's form.
func (n namespaceJSON) info() (ledger.NamespaceInfo, error) {
	h, err := chain.ParseHash(n.Head.Hash)
	if err != nil {
		return ledger.NamespaceInfo{}, fmt.Errorf("namespace %s: head: %w", n.Name, err)
	}
	return ledger.NamespaceInfo{Name: n.Name, Head: ledger.Head{Seq: n.Head.Seq, Hash: h}, KeyTTL: n.KeyTTLMS}, nil
}
