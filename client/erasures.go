package client

import (
	"context"
	"net/http"
)

// Erasure selects payloads to erase (SPEC §14): exactly one of Keys (every
// generation of each) or Subject; Fields (default the four payload
// fields) and a Reason (1–256 characters, itself erasable).
type Erasure struct {
	Keys    []string `json:"keys,omitempty"`
	Subject string   `json:"subject,omitempty"`
	Fields  []string `json:"fields,omitempty"`
	Reason  string   `json:"reason,omitempty"`
}

// Erased is the answer to an erasure.
type Erased struct {
	// Status is "erased" (an erase receipt was appended) or
	// "nothing_to_erase".
	Status  string      `json:"status"`
	Receipt *ReceiptRef `json:"receipt,omitempty"`
	Count   uint64      `json:"count"`
	Keys    int         `json:"keys"`
	Inline  int         `json:"inline"`
	// Pending are selected keys still in flight: the receipt that
	// finalizes each is followed by an erase.
	Pending []string `json:"pending"`
	// Purged: the files no longer hold the values (SQLite); nil where the
	// ledger cannot tell (PostgreSQL).
	Purged *bool `json:"purged"`
}

// Erase erases payloads of the client's namespace (an admin token when
// tokens exist). Errors: ErrInvalidRequest, and the code payloads_inline
// when every selected receipt keeps its payloads inline.
func (c *Client) Erase(ctx context.Context, e Erasure) (*Erased, error) {
	var out Erased
	if _, err := c.exchange(ctx, "erase", http.MethodPost, c.route("/v1/erasures"), e, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
