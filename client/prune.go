package client

import (
	"context"
	"errors"
	"net/http"
)

// Prune is a prune's answer (SPEC §16).
type Prune struct {
	// Status is "pruned" (a prune receipt was appended), "already_pruned"
	// (Receipt is the prune that covers the seq asked) or
	// "nothing_to_prune".
	Status  string      `json:"status"`
	Receipt *ReceiptRef `json:"receipt,omitempty"`
	From    uint64      `json:"from,omitempty"`
	Through uint64      `json:"through"`
	// Segment is the archived segment's directory name under ledgerd's
	// archive directory; Digest the SHA-256 of its receipts.jsonl.
	Segment string `json:"segment,omitempty"`
	Digest  string `json:"digest,omitempty"`
	// Deleting: the bodies of the range are still being deleted.
	Deleting bool `json:"deleting"`
}

// Prune archives, then prunes, the client's namespace through seq
// through, or as far as its policy allows when through is 0 (an admin
// token when tokens exist). Errors: ErrNotPrunable, its Details["reason"]
// one of no_key_ttl, no_archive_policy, no_archive_dir, pinned (with
// "pinned_by"), not_checkpointed, moved.
func (c *Client) Prune(ctx context.Context, through uint64) (*Prune, error) {
	body := map[string]uint64{}
	if through > 0 {
		body["through"] = through
	}
	var out Prune
	if _, err := c.exchange(ctx, "prune", http.MethodPost, c.route("/v1/prune"), body, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// PruneStatus is what a namespace could prune now and what it pruned.
type PruneStatus struct {
	Namespace string `json:"namespace"`
	// Archive is the policy's archive member, nil when it has none.
	Archive *struct {
		KeepMS    uint64 `json:"keep_ms"`
		MinKeepMS uint64 `json:"min_keep_ms"`
	} `json:"archive"`
	Watermark     Watermark     `json:"watermark"`
	PrunedThrough uint64        `json:"pruned_through"`
	KeptThrough   uint64        `json:"kept_through"`
	Prunes        []PruneRecord `json:"prunes"`
}

// Watermark is the prunable watermark: Through is the last seq that may
// be pruned now, Floor the last old enough for archive.min_keep_ms, Head
// the chain's head, PinnedBy the key generation that holds it back.
type Watermark struct {
	Through  uint64 `json:"through"`
	Floor    uint64 `json:"floor"`
	Head     uint64 `json:"head"`
	PinnedBy *struct {
		Key   string `json:"key"`
		State string `json:"state"`
		Seq   uint64 `json:"seq"`
		Until uint64 `json:"until,omitempty"`
	} `json:"pinned_by,omitempty"`
}

// PruneRecord is one prune receipt of a namespace.
type PruneRecord struct {
	Seq      uint64 `json:"seq"`
	From     uint64 `json:"from"`
	Through  uint64 `json:"through"`
	Segment  string `json:"segment"`
	Digest   string `json:"digest"`
	Deleting bool   `json:"deleting"`
}

// PruneStatus reads the client's namespace's prunable watermark and
// prunes (an admin token when tokens exist; it scans the chain).
func (c *Client) PruneStatus(ctx context.Context) (*PruneStatus, error) {
	var out PruneStatus
	if _, err := c.exchange(ctx, "prune status", http.MethodGet, c.route("/v1/prune"), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Pruned says where a pruned receipt or key went (the details of a 410
// pruned): Seq the receipt asked for (0 for a key), PrunedThrough the
// last pruned seq, Prune the prune receipt, Segment the archived
// segment's directory name.
type Pruned struct {
	Seq, PrunedThrough, Prune uint64
	Segment                   string
}

// PrunedOf returns the details of err when it is a 410 pruned.
func PrunedOf(err error) (*Pruned, bool) {
	var e *Error
	if !errors.As(err, &e) || e.Code != string(ErrPruned.(code)) {
		return nil, false
	}
	num := func(k string) uint64 { v, _ := e.Details[k].(float64); return uint64(v) }
	seg, _ := e.Details["segment"].(string)
	return &Pruned{Seq: num("seq"), PrunedThrough: num("pruned_through"), Prune: num("prune"), Segment: seg}, true
}
