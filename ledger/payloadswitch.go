package ledger

import (
	"context"
	"encoding/json"
	"strings"

	"github.com/effect-ledger/effect-ledger/chain"
)

// The one-way switch of an inline namespace to committed payloads (SPEC
// §14): a policy receipt whose top-level member "payloads" is "committed"
// ends the inline part; the receipts after it are committed, those up to
// it stay inline (they are the chain, and cannot be erased). The chain is
// the record of the switch: the stored payload mode stays the one the
// namespace was created with, and every reader finds the switch among the
// policy receipts. Every policy this ledger records after a switch says
// "payloads": "committed" again (SetPolicy), so that under its head lock
// a batch reads the mode in force from the policy in force alone.

// SwitchesPayloads reports whether a policy receipt's text switches its
// namespace to committed payloads: a JSON object whose member "payloads"
// (exactly that name) is "committed". Anything else leaves it as it is.
func SwitchesPayloads(text string) bool {
	var top map[string]json.RawMessage
	if json.Unmarshal([]byte(text), &top) != nil {
		return false
	}
	var mode string
	return json.Unmarshal(top["payloads"], &mode) == nil && PayloadMode(mode) == PayloadsCommitted
}

// PolicyLister lists receipts by filter: where a switch is looked for.
type PolicyLister interface {
	ListReceipts(ctx context.Context, f ReceiptFilter) ([]chain.Receipt, *uint64, error)
}

// FindPayloadSwitch reads the policy receipts after seq after and returns
// the first that switches the namespace to committed payloads (at, 0 for
// none) and the last policy receipt read (through; after when none).
func FindPayloadSwitch(ctx context.Context, c PolicyLister, after uint64) (at, through uint64, err error) {
	f := ReceiptFilter{Kind: chain.KindPolicy, After: after, Limit: MaxPageLimit}
	through = after
	for {
		rs, next, err := c.ListReceipts(ctx, f)
		if err != nil {
			return 0, through, err
		}
		for i := range rs {
			through = rs[i].Seq
			if SwitchesPayloads(rs[i].Result) {
				return rs[i].Seq, through, nil
			}
		}
		if next == nil {
			return 0, through, nil
		}
		f.After = *next
	}
}

// PayloadsReader reads a namespace's stored payload mode and its policy
// receipts.
type PayloadsReader interface {
	PolicyLister
	Payloads(ctx context.Context) (PayloadMode, error)
}

// PayloadsOf returns the payload mode in force at the head of a namespace
// read from storage, and the seq of the policy receipt that switched it
// from inline (0: created so, or not switched).
func PayloadsOf(ctx context.Context, c PayloadsReader) (PayloadMode, uint64, error) {
	mode, err := c.Payloads(ctx)
	if err != nil || mode != PayloadsInline {
		return mode, 0, err
	}
	at, _, err := FindPayloadSwitch(ctx, c, 0)
	if err != nil || at == 0 {
		return mode, 0, err
	}
	return PayloadsCommitted, at, nil
}

// committedFrom returns where receipts read from c start to be committed:
// those with a seq above from are; ok is false when none is (an inline
// namespace). rs are the receipts about to be shown: one without a
// commitment needs no search for a switch.
func committedFrom(ctx context.Context, c PayloadsReader, rs []chain.Receipt) (from uint64, ok bool, err error) {
	mode, err := c.Payloads(ctx)
	if err != nil || mode == PayloadsCommitted {
		return 0, err == nil, err
	}
	if !anyCommitment(rs) {
		return 0, false, nil
	}
	at, _, err := FindPayloadSwitch(ctx, c, 0)
	return at, at > 0, err
}

// anyCommitment reports whether a receipt of rs holds a commitment.
func anyCommitment(rs []chain.Receipt) bool {
	for i := range rs {
		if hasCommitment(&rs[i]) {
			return true
		}
	}
	return false
}

// switchState is what a namespace created inline knows of its switch: the
// policy receipts up to through were read, and at is the one that
// switched it (0: none of them).
type switchState struct{ through, at uint64 }

// knownSwitch returns the switch the namespace knows of (0: none yet).
func (n *Namespace) knownSwitch() uint64 {
	if st := n.sw.Load(); st != nil {
		return st.at
	}
	return 0
}

// learnSwitch records what a search of the committed chain found: a
// switch, once known, stays.
func (n *Namespace) learnSwitch(at, through uint64) {
	for {
		old := n.sw.Load()
		next := &switchState{through: through, at: at}
		if old != nil {
			if old.at > 0 {
				return
			}
			next.through = max(old.through, through)
		}
		if n.sw.CompareAndSwap(old, next) {
			return
		}
	}
}

// PayloadSwitch returns the seq of the policy receipt that switched the
// namespace from inline to committed payloads (0: created committed, or
// still inline), reading the policy receipts appended since it last
// looked: another replica may have switched it.
func (n *Namespace) PayloadSwitch(ctx context.Context) (uint64, error) {
	if n.committed() {
		return 0, nil
	}
	var after uint64
	if st := n.sw.Load(); st != nil {
		if st.at > 0 {
			return st.at, nil
		}
		after = st.through
	}
	at, through, err := FindPayloadSwitch(ctx, n.chain, after)
	if err != nil {
		return 0, err
	}
	n.learnSwitch(at, through)
	return at, nil
}

// PayloadsNow is the payload mode in force at the head (SPEC §14), read
// again from the chain when the namespace knew no switch, and the seq of
// the policy receipt that switched it (0: none).
func (n *Namespace) PayloadsNow(ctx context.Context) (PayloadMode, uint64, error) {
	at, err := n.PayloadSwitch(ctx)
	if err != nil {
		return "", 0, err
	}
	if at > 0 {
		return PayloadsCommitted, at, nil
	}
	return n.payloads, 0, nil
}

// committed reports whether the receipts this run appends are committed:
// the namespace was created committed, or the policy in force, read under
// the head lock, switched it (after a switch every policy this ledger
// records says so). Never from what the namespace cached: another replica
// may have switched it.
func (t *batchTx) committed(ctx context.Context) (bool, error) {
	if t.n.committed() {
		return true, nil
	}
	if t.at.PolicySeq == 0 {
		return false, nil
	}
	p, _, err := t.policy(ctx)
	if err != nil {
		return false, err
	}
	return p.Payloads == PayloadsCommitted, nil
}

// committedFrom is committedFrom for receipts read in the run's
// transaction: from the switch, searched for in the committed chain when
// the policy in force is committed and the namespace knows of none yet
// (another replica switched it); when the switch is this batch's own, not
// committed yet, every receipt with a commitment.
func (t *batchTx) committedFrom(ctx context.Context) (uint64, bool, error) {
	c, err := t.committed(ctx)
	if err != nil || !c || t.n.committed() {
		return 0, c, err
	}
	at, err := t.n.PayloadSwitch(ctx)
	return at, true, err
}

// keyedHash returns the keyed form of the fingerprint fp (SPEC §14).
func (n *Namespace) keyedHash(ctx context.Context, fp string) (string, error) {
	k, err := n.FingerprintKey(ctx)
	if err != nil {
		return "", err
	}
	return KeyedHash(k, fp), nil
}

// hashLike is the fingerprint fp in the form of recorded, an input_hash
// the chain holds: keyed when recorded is, plain otherwise. A key reserved
// before its namespace switched keeps its sha256: fingerprint for its
// generation, and a request is compared with it like with like.
func (n *Namespace) hashLike(ctx context.Context, fp, recorded string) (string, error) {
	if fp == "" || !strings.HasPrefix(recorded, KeyedHashPrefix) {
		return fp, nil
	}
	return n.keyedHash(ctx, fp)
}

// settleInputHash sets the request's input_hash in the form this run
// records for a new key or generation: keyed when the run's receipts are
// committed, the plain sha256: fingerprint otherwise.
func (t *batchTx) settleInputHash(ctx context.Context, a *reserveArgs) error {
	if a.fp == "" {
		return nil
	}
	c, err := t.committed(ctx)
	if err != nil {
		return err
	}
	if !c {
		a.inputHash = a.fp
		return nil
	}
	if a.keyed == "" {
		if a.keyed, err = t.n.keyedHash(ctx, a.fp); err != nil {
			return err
		}
	}
	a.inputHash = a.keyed
	return nil
}

// inputHashLike sets the request's input_hash in the form of recorded, the
// input_hash of the key's generation (its first reserve or ask).
func (t *batchTx) inputHashLike(ctx context.Context, a *reserveArgs, recorded string) error {
	if a.fp == "" || recorded == "" {
		return nil
	}
	if !strings.HasPrefix(recorded, KeyedHashPrefix) {
		a.inputHash = a.fp
		return nil
	}
	if a.keyed == "" {
		var err error
		if a.keyed, err = t.n.keyedHash(ctx, a.fp); err != nil {
			return err
		}
	}
	a.inputHash = a.keyed
	return nil
}

// otherInputHash is the request's fingerprint in the form it is not
// using, for a namespace switched from inline, whose earlier keys hold
// plain fingerprints and later ones keyed ones ("" where one form is all
// there is).
func (t *batchTx) otherInputHash(ctx context.Context, a *reserveArgs) (string, error) {
	if a.fp == "" || t.n.committed() {
		return "", nil
	}
	c, err := t.committed(ctx)
	if err != nil || !c {
		return "", err
	}
	if a.inputHash == a.fp {
		if a.keyed == "" {
			if a.keyed, err = t.n.keyedHash(ctx, a.fp); err != nil {
				return "", err
			}
		}
		return a.keyed, nil
	}
	return a.fp, nil
}
