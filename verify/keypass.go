package verify

import (
	"context"
	"errors"

	"github.com/effect-ledger/effect-ledger/chain"
)

// keyPasses checks a database in two passes: the chain in seq order,
// from the pinned head on an incremental run, and then the key states in
// key order, one key in memory at a time, for the keys with a receipt
// after it. The database groups the duplicate effects and the repeated
// failures itself, on a connection of their own beside the key pass.
// Each read is a snapshot of its own, and ledgerd may append between
// them, so the key states and the groupings stop at the receipt the chain
// pass ended at: the report's head is then checked by all of them, and
// the next incremental run, which starts after it, misses nothing.
func (v *Verifier) keyPasses(ctx context.Context, r *run) error {
	r.audit.dups = nil // found by the database, in constant memory
	r.through = r.from
	err := v.db.Receipts(ctx, r.from, func(rc *chain.Receipt) error {
		r.through = max(r.through, rc.Seq)
		r.cc.add(rc)
		return nil
	})
	if err != nil {
		return err
	}
	queryPass := make(chan error, 1)
	go func() { queryPass <- v.readGroupings(ctx, r, true, nil, r.through) }()
	err = keyPass(ctx, v.db, r.state, r.stateCol, r.live, !r.trusted, r.through, r.now)
	return errors.Join(err, <-queryPass)
}

// keyPass runs the state checks in key order on the receipts after from
// (the pinned head, or the pruned prefix: SPEC §16) up to through (the
// end of the chain pass), and on a full run cross-checks the derived key
// records against the replayed state.
func keyPass(ctx context.Context, db DB, state *stateChecker, col *collector, from uint64, full bool, through, now uint64) error {
	if full {
		state.drift = newDriftChecker(ctx, col, db, through)
	}
	err := db.KeyReceipts(ctx, from, func(r *chain.Receipt) error {
		if r.Seq <= through {
			state.addGrouped(r, now)
		}
		return nil
	})
	state.finish(now)
	if state.drift != nil {
		if derr := state.drift.finish(ctx); err == nil {
			err = derr
		}
	}
	return err
}

// readGroupings runs the database's grouping queries one after the other
// on one connection: the duplicate successes (unless dups is false: a
// single pass decides after the chain whether they are needed) and the
// repeated failures, once fails lets them (a nil gate: at once). Rows
// after through, the chain pass's last seq, are left out.
func (v *Verifier) readGroupings(ctx context.Context, r *run, dups bool, fails *failureGate, through uint64) error {
	var errD, errR error
	if dups {
		r.dups, errD = readDuplicates(ctx, v.db, v.opts.Filter, r.live, through)
	}
	if errD == nil && fails.wait() {
		r.repeats, errR = readRepeats(ctx, v.db, v.opts.Filter, r.live, through)
	}
	return errors.Join(errD, errR)
}
