package ledger

import (
	"context"
	"fmt"
	"sync"

	"github.com/effect-ledger/effect-ledger/chain"
)

// Rotating the log's signing key (SPEC §9.2): a key receipt announces on
// the chain the verifier key that signs the namespace's checkpoints from
// then on and the id of the key it retires. The chain's rotations say
// which keys may sign: the latest announced key, and the key it retires
// while the log hands over.

// KeyRotation is one key receipt of a chain.
type KeyRotation struct {
	Seq        uint64
	VKey       string // the announced verifier key
	ID         string // its key id
	Retires    string // the id of the key it retires
	Actor      string
	RecordedAt uint64
}

// KeyHistory is a chain's rotations in seq order.
type KeyHistory []KeyRotation

// Current is the id of the latest announced key, "" when the chain
// announces none.
func (h KeyHistory) Current() string {
	if len(h) == 0 {
		return ""
	}
	return h[len(h)-1].ID
}

// Retiring is the id of the key the latest rotation retires: it may still
// sign beside the current one while the log hands over.
func (h KeyHistory) Retiring() string {
	if len(h) == 0 {
		return ""
	}
	return h[len(h)-1].Retires
}

// Active reports whether the key id may sign the chain's checkpoints:
// any key while the chain announces none, else the current key and the
// one it retires.
func (h KeyHistory) Active(id string) bool {
	return len(h) == 0 || id == h.Current() || id == h.Retiring()
}

// Announced returns the rotation that announced key id.
func (h KeyHistory) Announced(id string) (KeyRotation, bool) {
	for _, r := range h {
		if r.ID == id {
			return r, true
		}
	}
	return KeyRotation{}, false
}

// RetiredBy returns the rotation that retired key id.
func (h KeyHistory) RetiredBy(id string) (KeyRotation, bool) {
	for _, r := range h {
		if r.Retires == id {
			return r, true
		}
	}
	return KeyRotation{}, false
}

// RotationOf reads the rotation a key receipt announces.
func RotationOf(r *chain.Receipt) (KeyRotation, error) {
	k, err := chain.ParseKeyResult(r.Result)
	if err != nil {
		return KeyRotation{}, fmt.Errorf("key receipt %d: %w", r.Seq, err)
	}
	_, id, _ := chain.ParseVerifierKey(k.VKey)
	return KeyRotation{Seq: r.Seq, VKey: k.VKey, ID: id, Retires: k.Retires, Actor: r.Actor, RecordedAt: r.RecordedAt}, nil
}

// keyHistoryCache keeps the rotations read so far (a key receipt never
// changes); later ones are read after the last one seen.
type keyHistoryCache struct {
	mu   sync.Mutex
	hist KeyHistory
}

// KeyHistory returns the namespace's rotations, reading only the key
// receipts after the last one read before.
func (n *Namespace) KeyHistory(ctx context.Context) (KeyHistory, error) {
	n.keys.mu.Lock()
	defer n.keys.mu.Unlock()
	f := ReceiptFilter{Kind: chain.KindKey, Limit: MaxPageLimit}
	if len(n.keys.hist) == 0 {
		kept, err := n.keptKeyReceipts(ctx) // pruned ones (SPEC §16)
		if err != nil {
			return nil, fmt.Errorf("key history: %w", err)
		}
		n.keys.hist = kept
	}
	if len(n.keys.hist) > 0 {
		f.After = n.keys.hist[len(n.keys.hist)-1].Seq
	}
	for {
		rs, next, err := n.chain.ListReceipts(ctx, f)
		if err != nil {
			return nil, fmt.Errorf("key history: %w", err)
		}
		for i := range rs {
			rot, err := RotationOf(&rs[i])
			if err != nil {
				return nil, err
			}
			n.keys.hist = append(n.keys.hist, rot)
		}
		if next == nil {
			return append(KeyHistory(nil), n.keys.hist...), nil
		}
		f.After = *next
	}
}

// RotateRequest announces a new signing key.
type RotateRequest struct {
	// VKey is the new verifier key; its name must be the log's origin
	// prefix.
	VKey string
	// Retires is the id of the key it replaces; "" for the chain's
	// current key (the ledger's own key while the chain announces none).
	Retires string
	Actor   string
}

// RotateResult is the outcome of a RotateKey.
type RotateResult struct {
	Receipt  ReceiptRef
	Rotation KeyRotation
}

// RotateKey appends a key receipt announcing req.VKey and retiring the
// current key (SPEC §9.2). Errors: *Error with ECodeInvalidRequest (a
// malformed key, another key name, nothing known to retire) or
// ECodeKeyRotationConflict (the key retired, or the one announced, was
// already named by a key receipt, or the key retired is not the current
// one).
func (n *Namespace) RotateKey(ctx context.Context, req RotateRequest) (*RotateResult, error) {
	name, id, err := chain.ParseVerifierKey(req.VKey)
	if err != nil {
		return nil, Invalid("vkey", "vkey is not an Ed25519 verifier key NAME+ID+KEY: %v", err)
	}
	if p := n.l.cfg.LogKeyPrefix; p != "" && name != p {
		return nil, Invalid("vkey", "the new key is named %q, but the log's keys are named %q (its origin prefix): make it with ledgerctl keygen --origin %s", name, p, p)
	}
	if req.Retires != "" && !chain.ValidKeyID(req.Retires) {
		return nil, Invalid("retires", "retires must be a key id, 8 lowercase hex digits")
	}
	head, err := n.chain.Head(ctx)
	if err != nil {
		return nil, err
	}
	hist, err := n.KeyHistory(ctx)
	if err != nil {
		return nil, err
	}
	var res *RotateResult
	err = n.submit(ctx, "", func(ctx context.Context, t *batchTx) error {
		h, err := t.keyHistorySince(ctx, hist, head.Seq)
		if err != nil {
			return err
		}
		retires, err := n.retiring(h, req, id)
		if err != nil {
			return err
		}
		k := chain.KeyResult{VKey: req.VKey, Retires: retires}
		r, err := t.append(ctx, chain.Receipt{Kind: chain.KindKey, Result: k.Text(), Actor: req.Actor, RecordedAt: t.Now()})
		if err != nil {
			return err
		}
		res = &RotateResult{Receipt: refOf(&r), Rotation: KeyRotation{Seq: r.Seq, VKey: req.VKey, ID: id, Retires: retires,
			Actor: r.Actor, RecordedAt: r.RecordedAt}}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// keyHistorySince is hist with the key receipts appended after seq since
// (by another writer) read under the head lock.
func (t *batchTx) keyHistorySince(ctx context.Context, hist KeyHistory, since uint64) (KeyHistory, error) {
	for seq := since + 1; seq <= t.Head().Seq; seq++ {
		r, err := t.Receipt(ctx, seq)
		if err != nil {
			return nil, err
		}
		if r.Kind != chain.KindKey || len(hist) > 0 && r.Seq <= hist[len(hist)-1].Seq {
			continue
		}
		rot, err := RotationOf(&r)
		if err != nil {
			return nil, err
		}
		hist = append(hist, rot)
	}
	return hist, nil
}

// retiring decides which key a rotation to the key id retires, or why
// it may not happen.
func (n *Namespace) retiring(h KeyHistory, req RotateRequest, id string) (string, error) {
	if r, ok := h.Announced(id); ok {
		return "", keyConflict(r.Seq, "key %s was announced by key receipt %d: a key is announced once", id, r.Seq)
	}
	if r, ok := h.RetiredBy(id); ok {
		return "", keyConflict(r.Seq, "key %s was retired by key receipt %d and cannot come back", id, r.Seq)
	}
	current := h.Current()
	if current == "" {
		current = n.l.cfg.LogKeyBase
	}
	retires := req.Retires
	if retires == "" {
		retires = current
	}
	switch {
	case retires == "":
		return "", Invalid("retires", "this ledgerd signs no checkpoints and the chain announces no key: say which key id the new key retires")
	case retires == id:
		return "", Invalid("retires", "the new key %s cannot retire itself (it is the key in use)", id)
	}
	if r, ok := h.RetiredBy(retires); ok {
		return "", keyConflict(r.Seq, "key %s was already retired by key receipt %d", retires, r.Seq)
	}
	if len(h) > 0 && retires != current {
		return "", keyConflict(h[len(h)-1].Seq, "key %s is not the chain's current key %s (key receipt %d)", retires, current, h[len(h)-1].Seq)
	}
	return retires, nil
}

func keyConflict(seq uint64, format string, args ...any) *Error {
	return &Error{Code: ECodeKeyRotationConflict, Message: fmt.Sprintf(format, args...), Details: map[string]any{"seq": seq}}
}
