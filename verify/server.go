package verify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// Server is a ledger served over the API, read with the client module:
// the Remote of `ledgerctl verify --server` (NewRemote(Server{c}, opts)).
// It decodes the receipts the client hands over verbatim into
// chain.Receipt, so that their hashes are recomputed from what the
// server sent. Errors the server answers come back as *ServerError.
type Server struct{ Client *client.Client }

var _ Remote = Server{}

// ListReceipts returns one page of receipts; next is nil on the last.
func (s Server) ListReceipts(ctx context.Context, f ledger.ReceiptFilter) ([]chain.Receipt, *uint64, error) {
	page, next, err := s.Client.Receipts(ctx, client.ReceiptFilter{After: f.After, Limit: f.Limit, Key: f.Key,
		ExecutionID: f.ExecutionID, Tool: f.Tool, Kind: f.Kind})
	if err != nil {
		return nil, nil, ServerErr(err)
	}
	rs, err := decodeReceipts(page)
	if err != nil {
		return nil, nil, fmt.Errorf("receipts: %w", err)
	}
	if next == 0 {
		return rs, nil, nil
	}
	return rs, &next, nil
}

// decodeReceipts decodes receipts as the server sent them.
func decodeReceipts(raw []json.RawMessage) ([]chain.Receipt, error) {
	rs := make([]chain.Receipt, len(raw))
	for i := range raw {
		if err := json.Unmarshal(raw[i], &rs[i]); err != nil {
			return nil, fmt.Errorf("decode receipt: %w", err)
		}
	}
	return rs, nil
}

// Receipts pages through every receipt with seq > after, in seq order.
func (s Server) Receipts(ctx context.Context, after uint64, fn func(*chain.Receipt) error) error {
	return s.each(ctx, ledger.ReceiptFilter{After: after, Limit: ledger.MaxPageLimit}, fn)
}

// KeyHistory pages through one key's receipts in seq order.
func (s Server) KeyHistory(ctx context.Context, key string, fn func(*chain.Receipt) error) error {
	return s.each(ctx, ledger.ReceiptFilter{Key: key, Limit: ledger.MaxPageLimit}, fn)
}

func (s Server) each(ctx context.Context, f ledger.ReceiptFilter, fn func(*chain.Receipt) error) error {
	for {
		rs, next, err := s.ListReceipts(ctx, f)
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

// KeyTTL returns the key_ttl_ms of the client's namespace as GET
// /v1/namespaces lists it (SPEC §12): what an online verifier applies.
func (s Server) KeyTTL(ctx context.Context) (uint64, error) {
	n, err := s.namespace(ctx)
	if err != nil {
		return 0, fmt.Errorf("key ttl: %w", err)
	}
	return n.KeyTTLMS, nil
}

// Payloads returns the payload mode the client's namespace was created
// with, from GET /v1/namespaces (SPEC §14): a namespace a policy switched
// (committed_after) was created inline, and the verifier finds the switch
// on the chain. A server before v1.4 lists none: inline.
func (s Server) Payloads(ctx context.Context) (ledger.PayloadMode, error) {
	n, err := s.namespace(ctx)
	if err != nil {
		return "", fmt.Errorf("payload mode: %w", err)
	}
	if n.Payloads == "" || n.CommittedAfter > 0 {
		return ledger.PayloadsInline, nil
	}
	return ledger.PayloadMode(n.Payloads), nil
}

// SwitchedAt returns the seq of the policy receipt that switched the
// client's namespace to committed payloads, as GET /v1/namespaces lists it
// (committed_after; SPEC §14), 0 for none.
func (s Server) SwitchedAt(ctx context.Context) (uint64, error) {
	n, err := s.namespace(ctx)
	if err != nil {
		return 0, fmt.Errorf("payload switch: %w", err)
	}
	return n.CommittedAfter, nil
}

// namespace is the client's namespace as GET /v1/namespaces lists it.
func (s Server) namespace(ctx context.Context) (*client.NamespaceInfo, error) {
	list, err := s.Client.Namespaces(ctx)
	if err != nil {
		return nil, ServerErr(err)
	}
	ns := s.Client.Namespace()
	for i := range list {
		if list[i].Name == ns {
			return &list[i], nil
		}
	}
	return nil, fmt.Errorf("the server does not list namespace %q", ns)
}

// ServerError is an error answer of a server as the verifier and
// ledgerctl report it: "server: 404 unknown_key: …". It unwraps to the
// client's *client.Error and to the *ledger.Error of the same code, so
// that ledger.ErrorCode and errors.As read it as the ledger's own.
type ServerError struct{ Err *client.Error }

func (e *ServerError) Error() string {
	return fmt.Sprintf("server: %d %s: %s", e.Err.Status, e.Err.Code, e.Err.Message)
}

// Unwrap returns the client's error and the ledger's error of its code.
func (e *ServerError) Unwrap() []error {
	return []error{e.Err, &ledger.Error{Code: e.Err.Code, Message: e.Err.Message, Details: e.Err.Details,
		RetryAfter: e.Err.RetryAfter}}
}

// ServerErr returns err as a *ServerError when it is an error answer of
// the server (a *client.Error), else unchanged.
func ServerErr(err error) error {
	var ce *client.Error
	if errors.As(err, &ce) {
		return &ServerError{Err: ce}
	}
	return err
}
