package verify

import (
	"context"
	"errors"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// seqPass checks a full run of a database in one read of the chain, in
// seq order: the chain checks and the key states share the pass, each
// key's state compact (a slot of a stateTable) and all of them bounded by
// Opts.StateBudget; the keys beyond it are spilled to files and replayed
// after the pass (level.go, spill.go). The database groups the duplicate
// effects and the repeated failures itself, and the pass tells when
// neither query can find anything, so that they do not run.
func (v *Verifier) seqPass(ctx context.Context, r *run) error {
	r.stateCol.bySeq = true
	r.audit.dups = nil // found by the database, in constant memory
	// The single pass checks the keys table itself (level.keyRow); the
	// driftChecker only collects and re-checks its suspects.
	sp := &singlePass{ctx: ctx, src: v.db, state: r.state, drift: &driftChecker{col: r.stateCol, src: v.db},
		budget: v.opts.StateBudget, now: r.now}
	defer sp.cleanup()
	if h, err := v.db.Head(ctx); err == nil {
		sp.hint = h.Seq // at most one key per receipt
	}
	top, err := sp.newLevel(0, sp.hint)
	if err != nil {
		return err
	}
	defer func(level0 *level) {
		if level0.table != nil {
			level0.table.release()
		}
	}(top)
	// The pass notes each success's (tool, input_hash): when no two share
	// one, which is the usual case, the duplicate query is not run at all.
	var succ *successSet
	if sp.hint > 0 {
		succ = newSuccessSet(sp, sp.hint)
	}
	// The pass also watches for a failure the repeated-failures query
	// could start from: the query does not run when the pass ends without
	// one.
	fails := newFailureGate()
	top, err = v.replayChain(ctx, r, top, succ, fails)
	// The grouping queries run after the pass, beside the key states'
	// work, in snapshots that hold at least what the pass read, and leave
	// out the rows after its last seq: the audit ends at the report's
	// head, where an incremental run pinned to it starts.
	queryPass := make(chan error, 1)
	if err == nil {
		go func() { queryPass <- v.readGroupings(ctx, r, succ == nil, fails, r.through) }()
	} else {
		queryPass <- nil
	}
	// The successes noted are compared (sorted, partition files read
	// back) beside the key states' work after the pass.
	dupPass := make(chan error, 1)
	if succ != nil && err == nil {
		go func() { dupPass <- v.duplicatesIfAny(ctx, r, succ) }()
	} else {
		dupPass <- nil
	}
	if err == nil {
		err = v.finishStates(ctx, r, sp, top)
	}
	return errors.Join(err, <-queryPass, <-dupPass)
}

// replayChain reads the chain once. The chain checks and then the key
// states run on goroutines of their own, batches behind the reading. It
// returns the key states' level 0, or nil when a malformed row sends the
// state checks to the key-ordered pass.
func (v *Verifier) replayChain(ctx context.Context, r *run, top *level, succ *successSet, fails *failureGate) (*level, error) {
	var spErr error
	pruned := func(rc *chain.Receipt) bool { return r.cc.isPruned(rc) } // chain-checked only (SPEC §16)
	replay := newBatcher(func(rc *chain.Receipt) {
		r.cc.add(rc)
		if pruned(rc) {
			return
		}
		if succ != nil {
			succ.add(rc)
		}
		fails.see(rc)
	}, func(rc *chain.Receipt) {
		if top == nil || spErr != nil || pruned(rc) {
			return
		}
		if len(rc.Malformed) > 0 {
			// Re-reading by seq needs well-formed rows: the state
			// checks of an edited file take the key-ordered pass.
			top = nil
			return
		}
		e := eventOf(rc)
		spErr = top.add(&e, rc)
	})
	r.through = r.from
	err := v.db.Receipts(ctx, r.from, func(rc *chain.Receipt) error {
		r.through = max(r.through, rc.Seq)
		replay.add(rc)
		return nil
	})
	replay.close()
	fails.passDone()
	if err == nil {
		err = spErr
	}
	return top, err
}

// finishStates ends the key states of the pass: level 0 checks the keys
// table and replays what it spilled, and the drift checker re-checks its
// suspects. Without a level 0 (a malformed row) the state checks start
// again in key order.
func (v *Verifier) finishStates(ctx context.Context, r *run, sp *singlePass, top *level) error {
	if top == nil {
		r.stateCol = &collector{max: v.opts.MaxViolations}
		r.audit = newAuditBuilder(v.opts.Filter, r.live)
		r.audit.dups = nil
		r.state = newStateChecker(r.stateCol, r.audit, r.live, r.ttl)
		r.state.admin = v.opts.Admin
		r.state.open = v.opener(ctx, r)
		return keyPass(ctx, v.db, r.state, r.stateCol, r.live, !r.trusted, r.through, r.now)
	}
	sp.drift.through = r.through
	err := top.finish(func(fn func(*ledger.KeyRecord) error) error { return v.db.Keys(ctx, fn) })
	if err == nil {
		err = sp.drift.finish(ctx)
	}
	return err
}

// duplicatesIfAny runs the duplicate query when two successes of the
// pass may share a (tool, input_hash).
func (v *Verifier) duplicatesIfAny(ctx context.Context, r *run, succ *successSet) error {
	if !succ.mayRepeat() {
		return nil
	}
	var err error
	r.dups, err = readDuplicates(ctx, v.db, v.opts.Filter, r.live, r.through)
	return err
}
