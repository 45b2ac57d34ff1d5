package verify

import (
	"context"
	"errors"

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
	var touched map[string]struct{}
	if r.from > 0 {
		touched = map[string]struct{}{}
	}
	r.through = r.from
	if err := v.remote.Receipts(ctx, r.from, func(rc *chain.Receipt) error {
		r.through = max(r.through, rc.Seq)
		r.cc.add(rc)
		if touched != nil {
			touched[rc.IdempotencyKey] = struct{}{}
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
func (v *Verifier) touchedKeys(ctx context.Context, r *run, finder *repeatFinder, touched map[string]struct{}) error {
	var forFinder []chain.Receipt
	for key := range touched {
		if err := v.remote.KeyHistory(ctx, key, func(rc *chain.Receipt) error {
			if rc.Seq > r.through { // in seq order: the rest are later too
				return errStop
			}
			r.state.add(rc)
			if finder.wanted(rc) {
				forFinder = append(forFinder, *rc)
			}
			return nil
		}); err != nil && !errors.Is(err, errStop) {
			return err
		}
		r.state.flush(key, r.now)
	}
	finder.addUnordered(forFinder)
	return nil
}
