package verify

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/mod/sumdb/note"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// Rotated signing keys (SPEC §9.2). A verifier that trusts a key learns
// the next one only from a key receipt retiring it, proven included in a
// checkpoint that key signed; afterwards a checkpoint the retired key
// signs alone is checkpoint_key_retired, one signed by no key it knows
// checkpoint_key_unknown — never a silent switch.

// Rules of signing keys.
const (
	// RuleCheckpointKeyRetired: the checkpoint is signed by a key a key
	// receipt retired, and by no current key.
	RuleCheckpointKeyRetired = "checkpoint_key_retired"
	// RuleCheckpointKeyUnknown: the checkpoint is signed by no key the
	// verifier trusts or learnt from the chain (the detail names the key
	// ids that signed).
	RuleCheckpointKeyUnknown = "checkpoint_key_unknown"
)

// KeyTrust is what a verifier trusts to sign a log's checkpoints: the
// --state file keeps it between runs.
type KeyTrust struct {
	// Current are the verifier keys trusted now; a checkpoint signed by
	// any one of them is accepted.
	Current []string `json:"current"`
	// Retired are keys a key receipt retired.
	Retired []string `json:"retired,omitempty"`
	// Handovers are the key receipts learnt, in seq order.
	Handovers []Handover `json:"handovers,omitempty"`
}

// Handover is a key receipt a verifier learnt a key from.
type Handover struct {
	Seq     uint64 `json:"seq"`
	VKey    string `json:"vkey"`
	Retires string `json:"retires"`
	// Checkpoint is the size of the checkpoint, signed by the retired
	// key, that proved the receipt included.
	Checkpoint int64 `json:"checkpoint"`
}

// verifiers parses keys.
func verifiers(keys []string) ([]note.Verifier, error) {
	out := make([]note.Verifier, 0, len(keys))
	for _, k := range keys {
		v, err := tlog.NewVerifier(k)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// ids returns the key ids of keys (malformed ones left out).
func ids(keys []string) []string {
	var out []string
	for _, k := range keys {
		if _, id, err := chain.ParseVerifierKey(k); err == nil {
			out = append(out, id)
		}
	}
	return out
}

// keyOf returns the key of keys with id, "" if none.
func keyOf(keys []string, id string) string {
	for _, k := range keys {
		if _, kid, err := chain.ParseVerifierKey(k); err == nil && kid == id {
			return k
		}
	}
	return ""
}

// Covering finds a stored checkpoint that covers a receipt: the first
// one, signed while the key receipt was new.
type Covering func(ctx context.Context, seq int64) (*tlog.Signed, error)

// keyLearner follows the key receipts of a chain being read and learns
// the keys they announce (SPEC §9.2).
type keyLearner struct {
	trust    KeyTrust
	note     []byte // the checkpoint being checked, unverified
	size     int64  // its size
	covering Covering
	// proofs are the stored checkpoints a handover was learnt from,
	// by size: their roots must be the chain's there.
	proofs map[int64]tlog.Checkpoint
	err    error
}

// signedBy reports whether msg carries a valid signature by vkey.
func signedBy(msg []byte, vkey string) (tlog.Checkpoint, bool) {
	v, err := tlog.NewVerifier(vkey)
	if err != nil {
		return tlog.Checkpoint{}, false
	}
	c, err := tlog.OpenCheckpoint(msg, v, "")
	return c, err == nil
}

// receipt takes one receipt of the chain, in seq order; a key receipt
// retiring a current key is learnt if a checkpoint that key signed
// covers it. It returns the size of a stored checkpoint whose root the
// chain must have (0: none).
func (k *keyLearner) receipt(ctx context.Context, r *chain.Receipt) int64 {
	if r.Kind != chain.KindKey || int64(r.Seq) > k.size {
		return 0
	}
	res, err := chain.ParseKeyResult(r.Result)
	if err != nil {
		return 0 // invalid_field
	}
	old := keyOf(k.trust.Current, res.Retires)
	if old == "" || slices.Contains(k.trust.Current, res.VKey) {
		return 0 // not retiring a key trusted now (or learnt before)
	}
	var proof int64
	if _, ok := signedBy(k.note, old); !ok {
		c, err := k.covering(ctx, int64(r.Seq))
		if err != nil && k.err == nil {
			k.err = err
		}
		if c == nil || c.Size > k.size {
			return 0
		}
		cp, ok := signedBy([]byte(c.Note), old)
		if !ok {
			return 0
		}
		k.proofs[cp.Size] = cp
		proof = cp.Size
	}
	at := k.size
	if proof > 0 {
		at = proof
	}
	k.trust.Current = slices.DeleteFunc(k.trust.Current, func(s string) bool { return s == old })
	k.trust.Current = append(k.trust.Current, res.VKey)
	k.trust.Retired = append(k.trust.Retired, old)
	k.trust.Handovers = append(k.trust.Handovers, Handover{Seq: r.Seq, VKey: res.VKey, Retires: res.Retires, Checkpoint: at})
	return proof
}

// judge checks the checkpoint's signature against the trust learnt:
// the checkpoint itself, or a violation (retired, unknown) and, for a
// retired key, the checkpoint still, so that its root is compared.
func (k *keyLearner) judge(ns string) (tlog.Checkpoint, *Violation, error) {
	cur, err := verifiers(k.trust.Current)
	if err != nil {
		return tlog.Checkpoint{}, nil, err
	}
	cp, _, err := tlog.OpenCheckpointAny(k.note, cur, ns)
	switch {
	case err == nil:
		return cp, nil, nil
	case !errors.Is(err, tlog.ErrCheckpointSignature):
		return cp, nil, fmt.Errorf("%w: %w", ErrCheckpoint, err) // a wrong origin, a malformed note
	}
	retired, rerr := verifiers(k.trust.Retired)
	if rerr == nil && len(retired) > 0 {
		cp, by, rerr := tlog.OpenCheckpointAny(k.note, retired, ns)
		if rerr != nil && !errors.Is(rerr, tlog.ErrCheckpointSignature) {
			return cp, nil, fmt.Errorf("%w: %w", ErrCheckpoint, rerr)
		}
		if rerr == nil {
			return cp, &Violation{Seq: uint64(cp.Size), Rule: RuleCheckpointKeyRetired,
				Detail: fmt.Sprintf("the checkpoint of size %d is signed by key %s, which a key receipt retired, and by no current key (%s)",
					cp.Size, strings.Join(by, ", "), strings.Join(ids(k.trust.Current), ", "))}, nil
		}
	}
	name := ""
	if len(cur) > 0 {
		name = cur[0].Name()
	}
	signers := tlog.SignatureKeys(k.note, name)
	body, perr := tlog.ParseCheckpoint(tlog.NoteText(k.note))
	if perr != nil {
		return tlog.Checkpoint{}, nil, fmt.Errorf("%w: %w", ErrCheckpoint, err)
	}
	what := "no key of " + name
	if len(signers) > 0 {
		what = "key " + strings.Join(signers, ", ")
	}
	return body, &Violation{Seq: uint64(body.Size), Rule: RuleCheckpointKeyUnknown,
		Detail: fmt.Sprintf("the checkpoint of size %d has no valid signature by a trusted key (%s): it is signed by %s, which no key receipt proven under a trusted key announced",
			body.Size, strings.Join(ids(k.trust.Current), ", "), what)}, nil
}
