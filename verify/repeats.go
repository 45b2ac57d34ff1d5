package verify

import (
	"cmp"
	"context"
	"slices"
	"sync"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// RepeatSource can list, grouped by the database, the calls run again
// after they failed: for each (tool, non-empty input_hash) whose effect
// failed, its first failure and then the first reserve of every key
// reserved after it, ordered by tool, input_hash and seq. Without it the
// audit finds them in the seq-ordered chain pass, holding each failed
// call in memory.
type RepeatSource interface {
	RepeatedFailures(ctx context.Context, tool string, fn func(*ledger.CallAfterFailure) error) error
}

// repeatCollector turns rows grouped by (tool, input_hash), the failure
// first and then the later runs in seq order, into RepeatedFailure
// entries, keeping those whose latest repeat is after from and in the
// window. Each key is listed once in Keys; Executions and Seqs hold
// every run.
type repeatCollector struct {
	win  window
	from uint64
	out  []RepeatedFailure

	cur                 *RepeatedFailure
	latestSeq, latestAt uint64
}

func (c *repeatCollector) add(r *ledger.CallAfterFailure) {
	if r.Failure {
		c.flush()
		c.cur = &RepeatedFailure{Tool: r.Tool, InputHash: r.InputHash, ErrorCode: r.ErrorCode,
			Keys: []string{r.Key}, Executions: []string{r.ExecutionID}, Seqs: []uint64{r.Seq}}
		c.latestSeq, c.latestAt = 0, 0
		return
	}
	listed := c.cur != nil && slices.Contains(c.cur.Keys, r.Key)
	if c.cur == nil || c.cur.Tool != r.Tool || c.cur.InputHash != r.InputHash || r.Seq <= c.cur.Seqs[0] ||
		!r.Rerun && listed {
		return // not after a failure, or a key's first reserve listed already (only in an edited ledger)
	}
	if !listed { // a key run again under the same key is listed once
		c.cur.Keys = append(c.cur.Keys, r.Key)
	}
	c.cur.Executions = append(c.cur.Executions, r.ExecutionID)
	c.cur.Seqs = append(c.cur.Seqs, r.Seq)
	if r.Seq > c.latestSeq {
		c.latestSeq, c.latestAt = r.Seq, r.RecordedAt
	}
}

func (c *repeatCollector) flush() {
	if c.cur != nil && len(c.cur.Seqs) > 1 && c.latestSeq > c.from && c.win.has(c.cur.Tool, c.latestSeq, c.latestAt) {
		c.out = append(c.out, *c.cur)
	}
	c.cur = nil
}

// readRepeats reads the repeated failures from src, applying the audit's
// filters, and leaves out the rows after through, like readDuplicates (a
// failure after it takes its whole group along: its repeats come later).
// Like readDuplicates it shares nothing with the key pass.
func readRepeats(ctx context.Context, src RepeatSource, f AuditFilter, from, through uint64) ([]RepeatedFailure, error) {
	c := &repeatCollector{win: f.window(), from: from}
	err := src.RepeatedFailures(ctx, f.Tool, func(r *ledger.CallAfterFailure) error {
		if r.Seq <= through {
			c.add(r)
		}
		return nil
	})
	c.flush()
	return c.out, err
}

// repeatFinder finds repeated failures in receipts given in seq order
// (the online chain pass). It holds each failed (tool, input_hash) and
// the keys reserved after its failure, never the other receipts: memory
// grows with the failed calls, not with the ledger.
type repeatFinder struct {
	groups map[[2]string][]ledger.CallAfterFailure // the failure first
	// notApplied holds the execution of each not_applied outcome that
	// counts as a failure, by seq: a reserve naming one by another
	// execution repeats the call under the same key (SPEC §4.1).
	notApplied map[uint64]string
	// askRef holds each ask's ref_seq by seq, approvalRef each approval's
	// ask: a reserve that consumed an approval is judged by what its ask
	// references (SPEC §13).
	askRef, approvalRef map[uint64]uint64
}

func newRepeatFinder() *repeatFinder {
	return &repeatFinder{groups: map[[2]string][]ledger.CallAfterFailure{}, notApplied: map[uint64]string{},
		askRef: map[uint64]uint64{}, approvalRef: map[uint64]uint64{}}
}

// ref is what a reserve names for §4: its ref_seq, or for one that
// consumed an approval, what the approval's ask names.
func (f *repeatFinder) ref(r *chain.Receipt) uint64 {
	if ask, ok := f.approvalRef[r.RefSeq]; ok {
		return f.askRef[ask]
	}
	return r.RefSeq
}

// isFailure reports whether r is an outcome the repeated failures count.
func isFailure(r *chain.Receipt) bool {
	return (r.Kind == chain.KindCommit || r.Kind == chain.KindResolve) && ledger.CountsAsFailure(r.Outcome, r.ErrorCode)
}

// add takes the next receipt in seq order.
func (f *repeatFinder) add(r *chain.Receipt) {
	switch r.Kind {
	case chain.KindAsk:
		f.askRef[r.Seq] = r.RefSeq
	case chain.KindApproval:
		f.approvalRef[r.Seq] = r.RefSeq
	}
	if r.InputHash == "" {
		return
	}
	id := [2]string{r.Tool, r.InputHash}
	switch {
	case isFailure(r):
		if r.Outcome == chain.OutcomeNotApplied {
			f.notApplied[r.Seq] = r.ExecutionID
		}
		if _, ok := f.groups[id]; !ok {
			f.groups[id] = []ledger.CallAfterFailure{{Tool: r.Tool, InputHash: r.InputHash, Failure: true,
				Key: r.IdempotencyKey, ExecutionID: r.ExecutionID, ErrorCode: r.ErrorCode, Seq: r.Seq,
				RecordedAt: r.RecordedAt}}
		}
	case r.Kind == chain.KindReserve && f.ref(r) == 0:
		if g, ok := f.groups[id]; ok {
			f.groups[id] = append(g, ledger.CallAfterFailure{Tool: r.Tool, InputHash: r.InputHash,
				Key: r.IdempotencyKey, ExecutionID: r.ExecutionID, Seq: r.Seq, RecordedAt: r.RecordedAt})
		}
	case r.Kind == chain.KindReserve:
		exec, ok := f.notApplied[f.ref(r)]
		if g, found := f.groups[id]; found && ok && exec != r.ExecutionID {
			f.groups[id] = append(g, ledger.CallAfterFailure{Tool: r.Tool, InputHash: r.InputHash, Rerun: true,
				Key: r.IdempotencyKey, ExecutionID: r.ExecutionID, Seq: r.Seq, RecordedAt: r.RecordedAt})
		}
	}
}

// addUnordered takes receipts in any order (the key histories of an
// incremental online run): it sorts them by seq, then adds them.
func (f *repeatFinder) addUnordered(rs []chain.Receipt) {
	slices.SortFunc(rs, func(x, y chain.Receipt) int { return cmp.Compare(x.Seq, y.Seq) })
	for i := range rs {
		f.add(&rs[i])
	}
}

// wanted reports whether r can matter to a repeatFinder.
func (f *repeatFinder) wanted(r *chain.Receipt) bool {
	return r.InputHash != "" && (r.Kind == chain.KindReserve || r.Kind == chain.KindAsk || r.Kind == chain.KindApproval || isFailure(r))
}

// list returns the entries, ordered by tool and input_hash, filtered as
// readRepeats does.
func (f *repeatFinder) list(flt AuditFilter, from uint64) []RepeatedFailure {
	ids := make([][2]string, 0, len(f.groups))
	for id, g := range f.groups {
		if len(g) > 1 && (flt.Tool == "" || id[0] == flt.Tool) {
			ids = append(ids, id)
		}
	}
	slices.SortFunc(ids, func(x, y [2]string) int { return cmp.Or(cmp.Compare(x[0], y[0]), cmp.Compare(x[1], y[1])) })
	c := &repeatCollector{win: flt.window(), from: from}
	for _, id := range ids {
		for i := range f.groups[id] {
			c.add(&f.groups[id][i])
		}
	}
	c.flush()
	return c.out
}

// failureGate holds the repeated-failures query of a single pass until
// the pass meets a receipt the query could start from: a failed commit
// or resolve with an input_hash, or a malformed row (whose values SQL may
// compare its own way). A pass without one means the query would list
// nothing (the usual ledger: it would read the kind index and a row per
// commit for nothing). A nil gate lets the query run at once.
type failureGate struct {
	seen, done chan struct{}
	once       sync.Once
}

func newFailureGate() *failureGate {
	return &failureGate{seen: make(chan struct{}), done: make(chan struct{})}
}

// see takes the next receipt of the pass.
func (g *failureGate) see(r *chain.Receipt) {
	if len(r.Malformed) > 0 || r.InputHash != "" && isFailure(r) {
		g.once.Do(func() { close(g.seen) })
	}
}

// passDone says that the pass has ended (or failed): see is not called
// again.
func (g *failureGate) passDone() {
	if g != nil {
		close(g.done)
	}
}

// wait blocks until the query may be needed or the pass has ended, and
// reports whether to run it.
func (g *failureGate) wait() bool {
	if g == nil {
		return true
	}
	select {
	case <-g.seen:
		return true
	case <-g.done:
	}
	select {
	case <-g.seen:
		return true
	default:
		return false
	}
}
