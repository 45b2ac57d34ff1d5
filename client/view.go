package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// Renewal names the latest receipt of the previous generation of a key
// whose outcome had expired (SPEC §12): the reserve that starts the new
// generation links to it.
type Renewal struct {
	Seq        uint64
	RecordedAt time.Time
}

// KeyReceipt is a receipt as a key view lists it: the fields that tell
// what happened, with the chain hash.
type KeyReceipt struct {
	Seq            uint64 `json:"seq"`
	Kind           string `json:"kind"`
	ExecutionID    string `json:"execution_id"`
	Attempt        uint64 `json:"attempt"`
	Outcome        string `json:"outcome"`
	ExternalRef    string `json:"external_ref"`
	ErrorCode      string `json:"error_code"`
	Retryable      bool   `json:"retryable"`
	LeaseExpiresAt int64  `json:"lease_expires_at"`
	RefSeq         uint64 `json:"ref_seq"`
	RecordedAt     int64  `json:"recorded_at"`
	Hash           string `json:"hash"`
	// JSON is the receipt's whole object as the ledger sent it (SPEC §2),
	// for a verifier that decodes it with its own receipt type.
	JSON json.RawMessage `json:"-"`
}

// KeyView is a key's state as the ledger reports it (GET
// /v1/effects/{key}).
type KeyView struct {
	Key        string
	State      string // "reserved", "interrupted", "succeeded", "failed", "not_applied", "awaiting_approval", "approved", "approval_expired" or "rejected"
	Tool       string
	Class      Class
	Idempotent bool
	InputHash  string
	// ExpiresAt is when a succeeded or failed key of a namespace with a
	// key lifetime is forgotten: a reserve from then on starts a new
	// generation of the key. Zero when the key does not expire.
	ExpiresAt time.Time
	// Receipts are the current generation's, oldest first (every
	// generation's when asked for the history).
	Receipts []KeyReceipt
}

// Key returns the state of key, its expiry and the receipts of its
// current generation, or of every generation with history. Errors:
// ErrUnknownKey, ErrInvalidKey as *Error.
func (c *Client) Key(ctx context.Context, key string, history bool) (*KeyView, error) {
	path := "/v1/effects/" + url.PathEscape(key)
	if history {
		path += "?history=true"
	}
	var b struct {
		IdempotencyKey string            `json:"idempotency_key"`
		State          string            `json:"state"`
		Tool           string            `json:"tool"`
		Effect         Class             `json:"effect"`
		Idempotent     bool              `json:"idempotent"`
		InputHash      string            `json:"input_hash"`
		ExpiresAt      int64             `json:"expires_at"`
		Receipts       []json.RawMessage `json:"receipts"`
	}
	if _, err := c.exchange(ctx, "key", http.MethodGet, c.route(path), nil, &b); err != nil {
		return nil, err
	}
	v := &KeyView{Key: b.IdempotencyKey, State: b.State, Tool: b.Tool, Class: b.Effect, Idempotent: b.Idempotent,
		InputHash: b.InputHash}
	if b.Receipts != nil {
		v.Receipts = make([]KeyReceipt, len(b.Receipts))
	}
	for i, raw := range b.Receipts {
		if err := json.Unmarshal(raw, &v.Receipts[i]); err != nil {
			return nil, fmt.Errorf("key: decode receipt: %w", err)
		}
		v.Receipts[i].JSON = raw
	}
	if b.ExpiresAt > 0 {
		v.ExpiresAt = time.UnixMilli(b.ExpiresAt)
	}
	return v, nil
}
