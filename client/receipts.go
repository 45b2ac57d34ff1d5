package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
)

// This file is the auditor's side: the chain itself, read page by page.

// ReceiptFilter selects receipts (GET /v1/receipts); zero members select
// every receipt.
type ReceiptFilter struct {
	After       uint64 // only receipts with a greater seq
	Limit       int    // at most this many (0: the ledger's default)
	Key         string // one idempotency key's receipts
	ExecutionID string
	Tool        string
	Kind        string // reserve, commit, resolve, ask, approval, policy
}

// Receipts returns one page of the receipts of the client's namespace in
// seq order. Each is the receipt's JSON object (SPEC §2) as the ledger
// sent it, so that a verifier decodes it with its own receipt type and
// recomputes its hash from exactly those fields. next is the After of
// the next page, 0 on the last.
func (c *Client) Receipts(ctx context.Context, f ReceiptFilter) (receipts []json.RawMessage, next uint64, err error) {
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
		Receipts  []json.RawMessage `json:"receipts"`
		NextAfter *uint64           `json:"next_after"`
	}
	if _, err := c.exchange(ctx, "receipts", http.MethodGet, c.route("/v1/receipts?"+q.Encode()), nil, &b); err != nil {
		return nil, 0, err
	}
	if b.NextAfter != nil {
		next = *b.NextAfter
	}
	return b.Receipts, next, nil
}

// Head returns the latest receipt of the client's namespace (GET
// /v1/head); seq 0 while the chain is empty.
func (c *Client) Head(ctx context.Context) (ReceiptRef, error) {
	var b ReceiptRef
	if _, err := c.exchange(ctx, "head", http.MethodGet, c.route("/v1/head"), nil, &b); err != nil {
		return ReceiptRef{}, err
	}
	return b, nil
}

// PrunedPrefix is what GET /v1/head says of a pruned namespace's pruned
// prefix (SPEC §16): receipts 1…Through are pruned, Hash is the chain
// hash of receipt Through (from which the live chain goes on), Prune the
// latest prune receipt.
type PrunedPrefix struct {
	Through uint64 `json:"through"`
	Hash    string `json:"hash"`
	Prune   uint64 `json:"prune"`
}

// PrunedPrefix returns the pruned prefix of the client's namespace as GET
// /v1/head says it, nil when nothing is pruned.
func (c *Client) PrunedPrefix(ctx context.Context) (*PrunedPrefix, error) {
	var b struct {
		Pruned *PrunedPrefix `json:"pruned"`
	}
	if _, err := c.exchange(ctx, "head", http.MethodGet, c.route("/v1/head"), nil, &b); err != nil {
		return nil, err
	}
	return b.Pruned, nil
}
