package verify

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/effect-ledger/effect-ledger/chain"
)

// memoryPass checks a server's ledger. The chain comes in seq order and
// the key states ride on that pass, every key in memory; repeated
// failures are found in the same pass. An incremental run reads the
// chain from the pinned head and then, key by key, the whole history of
// each key it touched, up to where the chain pass ended: the server
// answers each request from a newer snapshot.
func (v *Verifier) memoryPass(ctx context.Context, r *run) error {
	finder := newRepeatFinder()
	var touched map[string]uint64 // key → the last of its receipts the chain pass read
	if r.trusted {
		touched = map[string]uint64{}
	}
	r.through = r.from
	if err := v.remote.Receipts(ctx, r.from, func(rc *chain.Receipt) error {
		r.through = max(r.through, rc.Seq)
		r.cc.add(rc)
		if touched != nil {
			if rc.IdempotencyKey != "" { // a policy names no key
				touched[rc.IdempotencyKey] = rc.Seq
			}
		} else {
			r.state.add(rc)
			finder.add(rc)
		}
		return nil
	}); err != nil {
		return err
	}
	if touched != nil {
		if err := v.touchedKeys(ctx, r, finder, touched); err != nil {
			return err
		}
	}
	r.state.finish(r.now)
	r.repeats = finder.list(v.opts.Filter, r.from)
	return nil
}

// touchedKeys replays the histories of the keys an incremental run
// touched, up to r.through: receipts appended since the chain pass are the
// next run's. They come key by key: the finder gets what matters to it
// sorted by seq. It sees the failures of touched keys only, so an
// incremental online run misses a repeat of a call that failed under an
// older, untouched key.
func (v *Verifier) touchedKeys(ctx context.Context, r *run, finder *repeatFinder, touched map[string]uint64) error {
	var forFinder []chain.Receipt
	for key, last := range touched {
		hist, err := v.keyHistory(ctx, key, last, r.through)
		if err != nil {
			return err
		}
		for i := range hist {
			r.state.add(&hist[i])
			if finder.wanted(&hist[i]) {
				forFinder = append(forFinder, hist[i])
			}
		}
		r.state.flush(key, r.now)
	}
	finder.addUnordered(forFinder)
	return nil
}

// historyAttempts and historyRetry bound how long keyHistory waits for a
// server's key lookups to reach a receipt its chain already serves.
const (
	historyAttempts = 50
	historyRetry    = 10 * time.Millisecond
)

// keyHistory returns key's receipts up to through, which must reach last,
// the key's last receipt the chain pass read. A server may list a receipt
// by seq a moment before its lookups by key show it (SQLite's ledgerd
// applies each batch to its key index just after the COMMIT that makes
// the batch readable), so a history that falls short is asked for again:
// a state replayed from it would leave the receipt unchecked under the
// head this run pins.
func (v *Verifier) keyHistory(ctx context.Context, key string, last, through uint64) ([]chain.Receipt, error) {
	for attempt := 1; ; attempt++ {
		var hist []chain.Receipt
		err := v.remote.KeyHistory(ctx, key, func(rc *chain.Receipt) error {
			if rc.Seq > through { // in seq order: the rest are later too
				return errStop
			}
			hist = append(hist, *rc)
			return nil
		})
		if err != nil && !errors.Is(err, errStop) {
			return nil, err
		}
		if len(hist) > 0 && hist[len(hist)-1].Seq >= last {
			return hist, nil
		}
		if attempt == historyAttempts {
			return nil, fmt.Errorf("key %q: the server's history of the key lacks receipt %d, which its chain serves", key, last)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(historyRetry):
		}
	}
}
