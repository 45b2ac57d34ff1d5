package ledger

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/internal/metrics"
)

// A recorded outcome is served only after its receipt is checked against
// the chain: its hash recomputed from the stored fields (SPEC §2) must
// equal its stored hash, and that must equal the hash the chain links to
// it (the next receipt's prev_hash, or the head's hash). A byte changed in
// the database file, which the database's own checks do not see, is then
// refused as integrity_error instead of replayed as if recorded.

// integrityErrors counts the refusals.
var integrityErrors = metrics.CounterVec("ledger_integrity_errors_total",
	"Recorded values refused (integrity_error) because their stored receipt does not match the chain's hash of it, by namespace.", "namespace")

// IntegrityError is a stored receipt that is not the one the chain
// recorded: the hash computed from its stored fields and prev_hash, its
// stored hash and the hash the chain links to it do not all agree.
type IntegrityError struct {
	Seq      uint64
	Claimed  chain.Hash // the receipt's stored hash
	Computed chain.Hash // from its stored fields and prev_hash; zero when a field is malformed
	Chained  chain.Hash // the next receipt's prev_hash, or the head's hash
}

func (e *IntegrityError) Error() string {
	return fmt.Sprintf("receipt %d: stored hash %s, computed %s, chained %s", e.Seq, e.Claimed, e.Computed, e.Chained)
}

// Unwrap returns chain.ErrHashMismatch.
func (e *IntegrityError) Unwrap() error { return chain.ErrHashMismatch }

// hashers keeps the buffers of CheckStored's hashing between calls.
var hashers = sync.Pool{New: func() any { return new(chain.Hasher) }}

// CheckStored checks r, a receipt read from storage, against chained, the
// hash the chain links to it: nil, or an *IntegrityError.
func CheckStored(r *chain.Receipt, chained chain.Hash) error {
	var computed chain.Hash
	if r.Malformed == nil {
		h := hashers.Get().(*chain.Hasher)
		computed = h.Hash(r.PrevHash, r)
		hashers.Put(h)
	}
	if r.Malformed == nil && computed == r.Hash && r.Hash == chained {
		return nil
	}
	return &IntegrityError{Seq: r.Seq, Claimed: r.Hash, Computed: computed, Chained: chained}
}

// chainedHash is the hash the chain links to receipt seq of the tx: the
// head's, or the next receipt's prev_hash.
func (t *batchTx) chainedHash(ctx context.Context, seq uint64) (chain.Hash, error) {
	if h := t.Head(); h.Seq == seq {
		return h.Hash, nil
	}
	next, err := t.Receipt(ctx, seq+1)
	if err != nil {
		return chain.Hash{}, err
	}
	return next.PrevHash, nil
}

// checkRecorded checks the receipt r of the tx before its value is
// served (integrity_error, *Error, when it fails).
func (t *batchTx) checkRecorded(ctx context.Context, r *chain.Receipt) error {
	chained, err := t.chainedHash(ctx, r.Seq)
	if err != nil {
		return err
	}
	return t.n.refuseTampered(ctx, CheckStored(r, chained))
}

// CheckReceipts checks receipts read from c (any order) before they are
// served: each one's hash against its stored fields, and those that carry
// an outcome or a result (commits, resolves, asks, answers) against the
// chain too — the next receipt's prev_hash (from the list, or read) or
// the head's hash. The other receipts of a key (reserves, replays) hold
// no recorded value, and a hot key has many of them: reading each one's
// successor would cost a query per replay. nil or an *IntegrityError.
func CheckReceipts(ctx context.Context, c KeyReader, rs []chain.Receipt) error {
	if len(rs) == 0 {
		return nil
	}
	head, err := c.Head(ctx)
	if err != nil {
		return err
	}
	bySeq := make(map[uint64]*chain.Receipt, len(rs))
	for i := range rs {
		bySeq[rs[i].Seq] = &rs[i]
	}
	for i := range rs {
		r := &rs[i]
		chained := head.Hash
		switch next, ok := bySeq[r.Seq+1]; {
		case r.Outcome == "" && r.Result == "":
			chained = r.Hash // its own hash only
		case ok:
			chained = next.PrevHash
		case r.Seq < head.Seq:
			n, err := c.GetReceipt(ctx, r.Seq+1)
			if err != nil {
				return fmt.Errorf("read receipt %d: %w", r.Seq+1, err)
			}
			chained = n.PrevHash
		case r.Seq > head.Seq:
			// appended after the head was read (a driver's head may lag
			// its readers by a commit): nothing links it yet but itself
			chained = r.Hash
		}
		if err := CheckStored(r, chained); err != nil {
			return err
		}
	}
	return nil
}

// refuseTampered turns err, a CheckStored failure (or nil), into the
// integrity_error the client gets: logged without the value, counted, and
// the ledger stops reporting ready.
func (n *Namespace) refuseTampered(ctx context.Context, err error) error {
	var ie *IntegrityError
	if !errors.As(err, &ie) {
		return err
	}
	n.l.logger.ErrorContext(ctx, "stored receipt does not match the chain; its value is not served",
		"namespace", n.name, "seq", ie.Seq, "stored_hash", ie.Claimed.String(),
		"computed_hash", ie.Computed.String(), "chained_hash", ie.Chained.String())
	integrityErrors.WithLabelValues(n.name).Inc()
	refusal := &Error{Code: ECodeIntegrityError,
		Message: fmt.Sprintf("receipt %d of namespace %s does not match the hash the chain recorded for it, so its value is not served; `ledgerctl verify` shows what changed", ie.Seq, n.name),
		Details: map[string]any{"seq": ie.Seq}}
	n.l.Fault(refusal)
	return refusal
}

// Fault records err when it shows that the stored ledger cannot be
// trusted — an integrity_error or ErrStorageCorrupt — and reports whether
// it did. From the first one on, Ready reports not ready (until the
// process restarts): the operator must look at the database.
func (l *Ledger) Fault(err error) bool {
	reason := ErrorCode(err)
	if reason != ECodeIntegrityError && reason != ECodeStorageCorrupt {
		return false
	}
	f := &Error{Code: ECodeUnavailable,
		Message: "the ledger found its stored data damaged (" + reason + "); an operator must check it with `ledgerctl verify`",
		Details: map[string]any{"reason": reason}}
	if l.fault.CompareAndSwap(nil, f) {
		l.logger.Error("ledger not ready: stored data damaged", "reason", reason, "err", err)
	}
	return true
}
