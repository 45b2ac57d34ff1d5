package sqlite

import (
	"context"
	"fmt"
	"sync"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// The open keys of each namespace (ledger.Store.OpenKeys): the keys whose
// latest reserve, commit or resolve is a reserve, which is what the key
// records derive (ReserveSeq > FinalSeq). The Store follows each
// namespace's receipts in seq order and keeps only its open keys in
// memory, with their lease ends: the first count of a namespace reads its
// receipts once; later counts read only the receipts appended since, and
// none for a namespace whose head has not moved (a closed file's head is
// known without opening it). The chain is the source, not the key index:
// the index serves a namespace only once its file has opened and caught
// it up, and a count read in seq order cannot miss a batch committed
// while it runs.

// openKeys follows the open keys of every namespace of a Store.
type openKeys struct {
	mu     sync.Mutex // one count at a time; guards spaces
	spaces map[string]*openSet
}

// openSet is one namespace's open keys as of its receipt seq.
type openSet struct {
	seq  uint64 // the receipts read so far end here
	held uint64 // the latest recorded_at read: decisions never use an earlier time
	keys map[string]openKey
}

// openKey is an open key's latest reservation.
type openKey struct {
	leaseEnd   uint64 // unix ms
	idempotent bool
}

// OpenKeys counts the open keys of every namespace, on the Store's clock
// held at the namespace's latest recorded_at (as Tx.Now is). A namespace
// it cannot read fails the count; what was read is kept for the next.
func (s *Store) OpenKeys(ctx context.Context) ([]ledger.OpenKeyCount, error) {
	names, err := s.Namespaces(ctx)
	if err != nil {
		return nil, err
	}
	s.open.mu.Lock()
	defer s.open.mu.Unlock()
	if s.open.spaces == nil {
		s.open.spaces = map[string]*openSet{}
	}
	clock := uint64(s.opts.Now().UnixMilli())
	var out []ledger.OpenKeyCount
	for _, ns := range names {
		set := s.open.spaces[ns]
		if set == nil {
			set = &openSet{keys: map[string]openKey{}}
			s.open.spaces[ns] = set
		}
		if err := s.followOpenKeys(ctx, ns, set); err != nil {
			return nil, fmt.Errorf("open keys of namespace %s: %w", ns, err)
		}
		out = append(out, set.count(ns, max(clock, set.held))...)
	}
	return out, nil
}

// followOpenKeys reads the receipts of ns appended since set was last
// brought up to date.
func (s *Store) followOpenKeys(ctx context.Context, ns string, set *openSet) error {
	c, err := s.Chain(ctx, ns)
	if err != nil {
		return err
	}
	h, err := c.Head(ctx)
	if err != nil || h.Seq <= set.seq {
		return err
	}
	switch c := c.(type) {
	case *lazyChain:
		_, err = use(ctx, c, func(fc *chainWriter) (struct{}, error) { return struct{}{}, set.follow(ctx, fc.Reader) })
	case *chainWriter:
		err = set.follow(ctx, c.Reader)
	case readOnlyChain:
		err = set.follow(ctx, c.Reader)
	default:
		err = fmt.Errorf("unexpected chain type %T", c)
	}
	return err
}

// follow applies the receipts after set.seq. Each row moves set.seq, so a
// read cut short leaves a consistent prefix for the next to continue.
func (set *openSet) follow(ctx context.Context, rd *Reader) error {
	rows, err := rd.r.QueryContext(ctx, sqlOpenKeysAfter, rd.args(set.seq)...)
	if err != nil {
		return classify(err)
	}
	defer func() { _ = rows.Close() }()
	for rows.Next() {
		var seq, lease, at uint64
		var kind, key string
		var idem bool
		if err := rows.Scan(&seq, &kind, &key, &idem, &lease, &at); err != nil {
			return err
		}
		if kind == "reserve" {
			set.keys[key] = openKey{leaseEnd: lease, idempotent: idem}
		} else { // a commit, resolve or reconcile: the outcome of the latest reservation
			delete(set.keys, key)
		}
		set.seq, set.held = seq, max(set.held, at)
	}
	return classify(rows.Err())
}

// count counts set's keys at now (unix ms), as ledger.StateOf decides.
func (set *openSet) count(ns string, now uint64) []ledger.OpenKeyCount {
	var n [2][2]int // [interrupted][idempotent]
	for _, k := range set.keys {
		n[b2i(now >= k.leaseEnd)][b2i(k.idempotent)]++
	}
	var out []ledger.OpenKeyCount
	for i, st := range []ledger.State{ledger.StateReserved, ledger.StateInterrupted} {
		for j, idem := range []bool{false, true} {
			if n[i][j] > 0 {
				out = append(out, ledger.OpenKeyCount{Namespace: ns, State: st, Idempotent: idem, Keys: n[i][j]})
			}
		}
	}
	return out
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
