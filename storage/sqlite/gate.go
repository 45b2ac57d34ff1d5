package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/keyindex"
)

// What the gate of SPEC §13 reads and writes (its part of ledger.Tx): the policy
// in force, a key's receipts, a (tool, input)'s recent outcomes and the
// asked inputs, which live in ns_approval_inputs, off the chain.

// readPolicySeq reads the seq of the chain's latest policy receipt (the
// partial index ns_receipts_policy answers it).
func readPolicySeq(ctx context.Context, q queryRower, ref chainRef) (uint64, error) {
	var seq uint64
	if err := q.QueryRowContext(ctx, sqlPolicySeq, ref.args()...).Scan(&seq); err != nil {
		return 0, fmt.Errorf("read policy seq: %w", classify(err))
	}
	return seq, nil
}

// KeyHistory reads key's receipts from since on: the key index's
// postings, then this batch's appends.
func (t *writeTx) KeyHistory(ctx context.Context, key string, since uint64) ([]chain.Receipt, error) {
	var out []chain.Receipt
	err := t.postings(ctx, keyindex.ByKey, key, max(since, 1)-1, func(r *chain.Receipt) bool {
		out = append(out, *r)
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("read key history: %w", err)
	}
	for _, r := range t.receipts {
		if r.IdempotencyKey == key && r.Seq >= since {
			out = append(out, *r)
		}
	}
	return out, nil
}

// RecentOutcomes finds the first receipt recorded at or after notBefore
// by a binary search on seq (recorded_at never decreases within a chain),
// then reads the tool's postings from there.
func (t *writeTx) RecentOutcomes(ctx context.Context, tool, inputHash string, notBefore uint64, fn func(*chain.Receipt) bool) error {
	from, err := t.firstRecordedAt(ctx, notBefore)
	if err != nil {
		return err
	}
	match := func(r *chain.Receipt) bool {
		return (r.Kind == chain.KindCommit || r.Kind == chain.KindResolve || r.Kind == chain.KindReconcile) && r.Tool == tool &&
			r.InputHash == inputHash && r.RecordedAt >= notBefore
	}
	more := true
	err = t.postings(ctx, keyindex.ByTool, tool, from-1, func(r *chain.Receipt) bool {
		if match(r) {
			more = fn(r)
		}
		return more
	})
	if err != nil {
		return fmt.Errorf("read recent outcomes: %w", err)
	}
	for _, r := range t.receipts {
		if !more {
			break
		}
		if match(r) {
			more = fn(r)
		}
	}
	return nil
}

// firstRecordedAt returns the smallest committed seq whose recorded_at is
// at least at (the base + 1 when none is).
func (t *writeTx) firstRecordedAt(ctx context.Context, at uint64) (uint64, error) {
	lo, hi := t.pruned.Kept+1, t.base+1 // the answer is in [lo, hi]
	for lo < hi {
		mid := lo + (hi-lo)/2
		var rec uint64
		err := t.tx.QueryRowContext(ctx, sqlRecordedAtOf, t.ref.args(mid)...).Scan(&rec)
		if err != nil {
			return 0, fmt.Errorf("read recorded_at of %d: %w", mid, classify(err))
		}
		if rec >= at {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo, nil
}

// postings calls fn with each committed receipt the index lists under
// value in f after seq after, until fn returns false.
func (t *writeTx) postings(ctx context.Context, f keyindex.Field, value string, after uint64, fn func(*chain.Receipt) bool) error {
	var readErr error
	err := t.idx.Seqs(t.ns, f, value, max(after, t.pruned.Through), func(seq uint64, _ []byte) (bool, error) {
		r, err := t.Receipt(ctx, seq)
		if err != nil {
			readErr = err
			return false, nil
		}
		return fn(&r), nil
	})
	if err != nil {
		return fmt.Errorf("%w: %w", ledger.ErrIO, err)
	}
	return readErr
}

// PutAskInput keeps an ask's input and purges the expired ones.
func (t *writeTx) PutAskInput(ctx context.Context, seq uint64, input string, deleteAfter, now uint64) error {
	if _, err := t.tx.ExecContext(ctx, sqlPurgeAskInputs, t.ref.args(now)...); err != nil {
		return fmt.Errorf("purge asked inputs: %w", classify(err))
	}
	if _, err := t.tx.ExecContext(ctx, sqlPutAskInput, t.ref.args(seq, input, deleteAfter)...); err != nil {
		return fmt.Errorf("keep asked input: %w", classify(err))
	}
	return nil
}

// SetAskInputDeadline moves an ask's input's deletion and purges the
// expired ones.
func (t *writeTx) SetAskInputDeadline(ctx context.Context, seq, deleteAfter, now uint64) error {
	if _, err := t.tx.ExecContext(ctx, sqlAskInputDeadline, t.ref.args(deleteAfter, seq)...); err != nil {
		return fmt.Errorf("set asked input deadline: %w", classify(err))
	}
	if _, err := t.tx.ExecContext(ctx, sqlPurgeAskInputs, t.ref.args(now)...); err != nil {
		return fmt.Errorf("purge asked inputs: %w", classify(err))
	}
	return nil
}

// MayHaveGateReceipts answers from the file's set of keys that have an
// ask or a deny (the file has one writer), then this batch's appends.
func (t *writeTx) MayHaveGateReceipts(ctx context.Context, key string) (bool, error) {
	if t.gated == nil {
		gated, err := t.gatedKeys(ctx)
		if err != nil {
			return true, err
		}
		t.gated = gated
	}
	if _, ok := t.gated[key]; ok {
		return true, nil
	}
	for _, r := range t.receipts {
		if r.IdempotencyKey == key && (r.Kind == chain.KindAsk || r.Kind == chain.KindDeny) {
			return true, nil
		}
	}
	return false, nil
}

// gatedKeys reads the keys of the committed asks and denies from the
// key index's postings by kind (the first batch that needs them: a file
// with few asks reads few receipts).
func (t *writeTx) gatedKeys(ctx context.Context) (map[string]struct{}, error) {
	keys := map[string]struct{}{}
	for _, kind := range []string{chain.KindAsk, chain.KindDeny} {
		err := t.postings(ctx, keyindex.ByKind, kind, 0, func(r *chain.Receipt) bool {
			keys[r.IdempotencyKey] = struct{}{}
			return true
		})
		if err != nil {
			return nil, fmt.Errorf("read asked keys: %w", err)
		}
	}
	return keys, nil
}

// PurgeAskInputs deletes the asked inputs past their deadline.
func (t *writeTx) PurgeAskInputs(ctx context.Context, now uint64) error {
	if _, err := t.tx.ExecContext(ctx, sqlPurgeAskInputs, t.ref.args(now)...); err != nil {
		return fmt.Errorf("purge asked inputs: %w", classify(err))
	}
	return nil
}

// AskInput reads the input kept for the ask at seq. A file of a schema
// before version 5 has no inputs.
func (rd *Reader) AskInput(ctx context.Context, seq, now uint64) (string, bool, error) {
	var in string
	err := rd.r.QueryRowContext(ctx, sqlAskInput, rd.args(seq, now)...).Scan(&in)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("read asked input: %w", classify(err))
	}
	return in, true, nil
}

// AskInput reads the input kept for the ask at seq.
func (f *lazyChain) AskInput(ctx context.Context, seq, now uint64) (string, bool, error) {
	type res struct {
		in    string
		found bool
	}
	r, err := use(ctx, f, func(fc *chainWriter) (res, error) {
		in, found, err := fc.AskInput(ctx, seq, now)
		return res{in, found}, err
	})
	return r.in, r.found, err
}
