package client

import (
	"context"
	"net/http"
)

// NamespaceInfo is a namespace with its head (GET /v1/namespaces).
type NamespaceInfo struct {
	Name string
	Head ReceiptRef
	// KeyTTLMS is the namespace's key_ttl_ms (SPEC §12): how long a
	// finished key is remembered, in milliseconds; 0 forever.
	KeyTTLMS uint64
	// Payloads is how the namespace keeps its payload fields (SPEC §14):
	// "inline" or "committed" ("" from a server before v1.4).
	Payloads string
	// CommittedAfter is the seq of the policy receipt that switched the
	// namespace from inline to committed payloads: its receipts up to it
	// stay inline, later ones are committed (0: no switch).
	CommittedAfter uint64
	// PrunedThrough is the namespace's pruned prefix (SPEC §16): receipts
	// 1…PrunedThrough were archived and pruned (0: none, or a server
	// before v1.4).
	PrunedThrough uint64
}

type namespaceJSON struct {
	Name           string     `json:"name"`
	Head           ReceiptRef `json:"head"`
	KeyTTLMS       uint64     `json:"key_ttl_ms"`
	Payloads       string     `json:"payloads,omitempty"`
	CommittedAfter uint64     `json:"committed_after,omitempty"`
	PrunedThrough  uint64     `json:"pruned_through,omitempty"`
}

// NamespaceOption is an option of CreateNamespace.
type NamespaceOption func(body map[string]any)

// WithPayloads creates the namespace with payload mode mode (SPEC §14):
// "inline" or "committed".
func WithPayloads(mode string) NamespaceOption {
	return func(body map[string]any) { body["payloads"] = mode }
}

// CreateNamespace creates the namespace name whose keys are forgotten
// keyTTLMS milliseconds after they finish, 0 never (an admin token when
// tokens exist), and returns it with its empty head. The client's own
// namespace does not matter. Errors: ErrNamespaceExists,
// ErrNamespaceLimit, ErrInvalidRequest.
func (c *Client) CreateNamespace(ctx context.Context, name string, keyTTLMS uint64, opts ...NamespaceOption) (*NamespaceInfo, error) {
	body := map[string]any{"name": name}
	if keyTTLMS != 0 {
		body["key_ttl_ms"] = keyTTLMS
	}
	for _, o := range opts {
		o(body)
	}
	var b namespaceJSON
	if _, err := c.exchange(ctx, "create namespace", http.MethodPost, "/v1/namespaces", body, &b); err != nil {
		return nil, err
	}
	n := NamespaceInfo(b)
	return &n, nil
}

// Namespaces lists the namespaces with their heads, in name order; a
// token limited to namespaces sees only those.
func (c *Client) Namespaces(ctx context.Context) ([]NamespaceInfo, error) {
	var b struct {
		Namespaces []namespaceJSON `json:"namespaces"`
	}
	if _, err := c.exchange(ctx, "namespaces", http.MethodGet, "/v1/namespaces", nil, &b); err != nil {
		return nil, err
	}
	out := make([]NamespaceInfo, 0, len(b.Namespaces))
	for _, n := range b.Namespaces {
		out = append(out, NamespaceInfo(n))
	}
	return out, nil
}
