package verify

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// DerivedSource can list the ledger's derived keys table in key byte
// order, the order of DB.KeyReceipts, so that the verifier can
// cross-check it against the replayed state with a merge join (or say
// that it has none: ledger.ErrNoKeyTable), and re-check one key in one
// snapshot (KeyDrift) before a difference counts as a violation.
type DerivedSource interface {
	Keys(ctx context.Context, fn func(*ledger.KeyRecord) error) error
	KeyDrift(ctx context.Context, key string) ([]string, error)
}

// DuplicateSource can list, in constant memory, the successes of distinct
// keys that share a tool and input, ordered by tool, input_hash and seq.
// Without it the audit keeps every succeeded key's fingerprint in memory.
type DuplicateSource interface {
	DuplicateSuccesses(ctx context.Context, fn func(*ledger.Success) error) error
}

// driftChecker compares, key by key, the state replayed from the receipts
// with the stored keys table, read concurrently in batches.
type driftChecker struct {
	// off: the source has no key records (ledger.ErrNoKeyTable), or its
	// derived state is wrong as a whole (ledger.ErrDerivedState, reported
	// once); the keys are then not compared one by one. Set by the
	// reader goroutine before it closes rows.
	off     atomic.Bool
	whole   error // the ErrDerivedState, reported by finish
	col     *collector
	src     DerivedSource
	through uint64    // the last seq the chain pass read (newer)
	suspect []suspect // keys that differed between the two snapshots
	cancel  context.CancelFunc
	rows    chan []ledger.KeyRecord
	errc    chan error
	batch   []ledger.KeyRecord
	cur     *ledger.KeyRecord
}

const driftBatch = 512

func newDriftChecker(ctx context.Context, col *collector, src DerivedSource, through uint64) *driftChecker {
	ctx, cancel := context.WithCancel(ctx)
	d := &driftChecker{col: col, src: src, through: through, cancel: cancel, rows: make(chan []ledger.KeyRecord, 4), errc: make(chan error, 1)}
	go func() {
		defer close(d.rows)
		batch := make([]ledger.KeyRecord, 0, driftBatch)
		err := src.Keys(ctx, func(k *ledger.KeyRecord) error {
			if batch = append(batch, *k); len(batch) == driftBatch {
				select {
				case d.rows <- batch:
				case <-ctx.Done():
					return ctx.Err()
				}
				batch = make([]ledger.KeyRecord, 0, driftBatch)
			}
			return nil
		})
		if err == nil && len(batch) > 0 {
			select {
			case d.rows <- batch:
			case <-ctx.Done():
			}
		}
		switch {
		case err == nil || errors.Is(err, context.Canceled):
		case d.unavailable(err):
		default:
			d.errc <- err
		}
	}()
	d.advance()
	return d
}

// unavailable reports whether err from the source's Keys means there is
// nothing to compare key by key, and turns the comparisons off if so.
func (d *driftChecker) unavailable(err error) bool {
	switch {
	case errors.Is(err, ledger.ErrNoKeyTable):
	case errors.Is(err, ledger.ErrDerivedState):
		d.whole = err
	default:
		return false
	}
	d.off.Store(true)
	return true
}

// comparing reports whether d compares stored key records (a nil d does
// not), so that callers skip the work of preparing a comparison.
func (d *driftChecker) comparing() bool { return d != nil && !d.off.Load() }

func (d *driftChecker) advance() {
	if len(d.batch) == 0 {
		d.batch = <-d.rows // nil once the reader is done
	}
	if len(d.batch) == 0 {
		d.cur = nil
		return
	}
	d.cur, d.batch = &d.batch[0], d.batch[1:]
}

// key checks the stored row of k, which comes after every key checked
// before it in byte order.
func (d *driftChecker) key(k *keyState) {
	for d.cur != nil && d.cur.Key < k.key {
		d.suspectf(d.cur.FirstSeq, d.cur.Key, d.cur, "the derived key records have key %q, which has no receipts", d.cur.Key)
		d.advance()
	}
	if !k.hasReserve {
		if d.cur != nil && d.cur.Key == k.key {
			d.suspectf(d.cur.FirstSeq, k.key, d.cur, "the derived key records have key %q, which has no reserve", k.key)
			d.advance()
		}
		return
	}
	want := wantRecord(k)
	if d.cur == nil || d.cur.Key != k.key {
		d.suspectf(want.FirstSeq, k.key, nil, "there is no derived key record for key %q", k.key)
		return
	}
	if *d.cur != want {
		d.suspectf(want.FirstSeq, k.key, d.cur, "the derived key record of %q is %+v; the receipts give %+v", k.key, *d.cur, want)
	}
	d.advance()
}

// stop ends the reader of the keys table, if there is one.
func (d *driftChecker) stop() {
	if d.rows == nil { // a single pass reads the table itself
		return
	}
	d.cancel()
	for range d.rows { // let the reader finish
	}
}

// newer reports whether a stored row names a receipt after the last one
// the chain pass read: ledgerd wrote it after the pass, so the difference
// is a race however many keys it touched (a busy ledger during a long
// run), and the row is re-checked rather than reported.
func (d *driftChecker) newer(row *ledger.KeyRecord) bool {
	return row != nil && max(row.FirstSeq, row.ReserveSeq, row.FinalSeq) > d.through
}

// suspect is a key whose stored row and replayed state differed.
type suspect struct {
	seq    uint64
	key    string
	detail string
}

// maxSuspects bounds the keys re-checked one by one; beyond it a
// difference is reported as found (a damaged table, not a race), unless
// the stored row names a receipt the chain pass did not read (newer). A
// variable for tests.
var maxSuspects = 10_000

// suspectf notes key, whose stored row (nil: none) differs from its
// replayed state, for a re-check in one snapshot.
func (d *driftChecker) suspectf(seq uint64, key string, row *ledger.KeyRecord, format string, args ...any) {
	if d.off.Load() {
		return
	}
	if len(d.suspect) >= maxSuspects && !d.newer(row) {
		d.col.addf(seq, RuleDerivedState, format, args...)
		return
	}
	d.suspect = append(d.suspect, suspect{seq, key, fmt.Sprintf(format, args...)})
}

// finish reports stored rows after the last key, re-checks the suspects
// in one snapshot each, and returns a read error.
func (d *driftChecker) finish(ctx context.Context) error {
	if d.whole != nil {
		d.col.addf(0, RuleDerivedState, "%v", d.whole)
		d.whole = nil
	}
	for d.cur != nil {
		d.suspectf(d.cur.FirstSeq, d.cur.Key, d.cur, "the derived key records have key %q, which has no receipts", d.cur.Key)
		d.advance()
	}
	// The merge join finds suspects in key order; a single pass finds
	// them level by level.
	slices.SortStableFunc(d.suspect, func(a, b suspect) int { return strings.Compare(a.key, b.key) })
	for _, s := range d.suspect {
		drift, err := d.src.KeyDrift(ctx, s.key)
		if err != nil {
			d.stop()
			return err
		}
		if len(drift) > 0 { // still different in one snapshot: not a race
			d.col.addf(s.seq, RuleDerivedState, "%s (%s)", s.detail, strings.Join(drift, "; "))
		}
	}
	d.stop()
	select {
	case err := <-d.errc:
		return err
	default:
		return nil
	}
}

// readDuplicates reads the duplicate effects from src, applying the
// audit's filters: an entry is kept when its latest success is after from
// and in the window. Successes after through, appended since the chain
// pass, are left out. It shares nothing with the key pass, so the two can
// run concurrently.
func readDuplicates(ctx context.Context, src DuplicateSource, f AuditFilter, from, through uint64) ([]DuplicateEffect, error) {
	win := f.window()
	var out []DuplicateEffect
	var cur *DuplicateEffect
	var seen map[string]bool // cur's keys: a group may hold many
	var latestSeq, latestAt uint64
	flush := func() {
		if cur != nil && len(cur.Keys) > 1 && latestSeq > from && win.has(cur.Tool, latestSeq, latestAt) {
			out = append(out, *cur)
		}
	}
	err := src.DuplicateSuccesses(ctx, func(s *ledger.Success) error {
		if s.Seq > through {
			return nil
		}
		if cur == nil || cur.Tool != s.Tool || cur.InputHash != s.InputHash {
			flush()
			cur, latestSeq, latestAt = &DuplicateEffect{Tool: s.Tool, InputHash: s.InputHash}, 0, 0
			seen = map[string]bool{}
		}
		if !seen[s.Key] {
			seen[s.Key] = true
			cur.Keys = append(cur.Keys, s.Key)
			cur.Seqs = append(cur.Seqs, s.Seq)
		}
		if s.Seq > latestSeq { // rows come in seq order
			latestSeq, latestAt = s.Seq, s.RecordedAt
		}
		return nil
	})
	flush()
	return out, err
}
