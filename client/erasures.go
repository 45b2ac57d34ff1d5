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

// NamespaceErasures are a namespace's erasures, its part of an erasures
// file (format effect-ledger/erasures/v1, docs/privacy.md): what a ledger
// restored from a backup taken before them needs to erase the same values
// (ledgerctl erase --replay).
type NamespaceErasures struct {
	Namespace string          `json:"namespace"`
	Erasures  []ErasureRecord `json:"erasures"`
	Pending   []PendingRecord `json:"pending"`
}

// PendingRecord is a key generation an erase selected while it was in
// flight: the receipt that finalizes it is to be erased. FirstSeq and Hash
// are the seq and chain hash of the reserve that started it, EraseSeq the
// erase that marked it (0: one that erased nothing).
type PendingRecord struct {
	Key      string   `json:"key"`
	FirstSeq uint64   `json:"first_seq"`
	Hash     string   `json:"hash"`
	EraseSeq uint64   `json:"erase_seq"`
	Fields   []string `json:"fields"`
}

// ErasureRecord is one erase receipt: its seq and chain hash, its fields,
// whether a retention sweep appended it, the MACs (hex) of the subjects it
// was asked for, and each receipt it erased.
type ErasureRecord struct {
	Seq       uint64         `json:"seq"`
	Hash      string         `json:"hash"`
	Fields    []string       `json:"fields"`
	Retention bool           `json:"retention"`
	Subjects  []string       `json:"subjects"`
	Erased    []ErasedRecord `json:"erased"`
}

// ErasedRecord is a receipt an erasure erased: seq, chain hash (hex) and
// the fields whose values it deleted.
type ErasedRecord struct {
	Seq    uint64   `json:"seq"`
	Hash   string   `json:"hash"`
	Fields []string `json:"fields"`
}

// Erasures lists every erasure of the client's namespace (GET
// /v1/ns/{ns}/erasures; an admin token when tokens exist).
func (c *Client) Erasures(ctx context.Context) (*NamespaceErasures, error) {
	var out NamespaceErasures
	if _, err := c.exchange(ctx, "erasures", http.MethodGet, c.route("/v1/erasures"), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
