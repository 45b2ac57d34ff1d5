package verify

import (
	"context"
	"errors"
	"slices"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// DerivedSource can list the ledger's derived keys table in key byte
// order, the order of KeySource.KeyReceipts, so that the verifier can
// cross-check it against the replayed state with a merge join.
type DerivedSource interface {
	Keys(ctx context.Context, fn func(*ledger.KeyRecord) error) error
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
	col    *collector
	cancel context.CancelFunc
	rows   chan []ledger.KeyRecord
	errc   chan error
	batch  []ledger.KeyRecord
	cur    *ledger.KeyRecord
}

const driftBatch = 512

func newDriftChecker(ctx context.Context, col *collector, src DerivedSource) *driftChecker {
	ctx, cancel := context.WithCancel(ctx)
	d := &driftChecker{col: col, cancel: cancel, rows: make(chan []ledger.KeyRecord, 4), errc: make(chan error, 1)}
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
		if err != nil && !errors.Is(err, context.Canceled) {
			d.errc <- err
		}
	}()
	d.advance()
	return d
}

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
		d.col.addf(d.cur.FirstSeq, RuleDerivedState, "keys table has key %q, which has no receipts", d.cur.Key)
		d.advance()
	}
	if !k.hasReserve {
		if d.cur != nil && d.cur.Key == k.key {
			d.col.addf(d.cur.FirstSeq, RuleDerivedState, "keys table has key %q, which has no reserve", k.key)
			d.advance()
		}
		return
	}
	want := ledger.KeyRecord{Key: k.key, Generated: k.first.KeyGenerated, Tool: k.first.Tool,
		Effect: k.first.Effect, InputHash: k.first.InputHash, Idempotent: k.first.Idempotent,
		FirstSeq: k.first.Seq, ReserveSeq: k.latest.seq, LeaseExpiresAt: k.latest.lease}
	if k.final.seq != 0 {
		want.FinalSeq = k.final.seq
	}
	if d.cur == nil || d.cur.Key != k.key {
		d.col.addf(want.FirstSeq, RuleDerivedState, "keys table has no row for key %q", k.key)
		return
	}
	if *d.cur != want {
		d.col.addf(want.FirstSeq, RuleDerivedState, "keys row for %q is %+v; the receipts give %+v", k.key, *d.cur, want)
	}
	d.advance()
}

// finish reports stored rows after the last key and returns a read error.
func (d *driftChecker) finish() error {
	for d.cur != nil {
		d.col.addf(d.cur.FirstSeq, RuleDerivedState, "keys table has key %q, which has no receipts", d.cur.Key)
		d.advance()
	}
	d.cancel()
	for range d.rows { // let the reader finish
	}
	select {
	case err := <-d.errc:
		return err
	default:
		return nil
	}
}

// readDuplicates reads the duplicate effects from src, applying the
// audit's filters. It shares nothing with the key pass, so the two can
// run concurrently.
func readDuplicates(ctx context.Context, src DuplicateSource, f AuditFilter, from uint64) ([]DuplicateEffect, error) {
	var since uint64
	if !f.Since.IsZero() {
		since = uint64(f.Since.UnixMilli())
	}
	var out []DuplicateEffect
	var cur *DuplicateEffect
	var latest uint64
	flush := func() {
		if cur != nil && len(cur.Keys) > 1 && anyAfter(cur.Seqs, from) && latest >= since &&
			(f.Tool == "" || cur.Tool == f.Tool) {
			out = append(out, *cur)
		}
	}
	err := src.DuplicateSuccesses(ctx, func(s *ledger.Success) error {
		if cur == nil || cur.Tool != s.Tool || cur.InputHash != s.InputHash {
			flush()
			cur, latest = &DuplicateEffect{Tool: s.Tool, InputHash: s.InputHash}, 0
		}
		if !slices.Contains(cur.Keys, s.Key) {
			cur.Keys = append(cur.Keys, s.Key)
			cur.Seqs = append(cur.Seqs, s.Seq)
		}
		latest = max(latest, s.RecordedAt)
		return nil
	})
	flush()
	return out, err
}
