package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/postgres"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/pgtest"
)

// groupOf makes a write appending n reserves to each chain.
func groupOf(chains []*postgres.Chain, n int, tag string) []ledger.Batch {
	batches := make([]ledger.Batch, len(chains))
	for i, c := range chains {
		batches[i] = ledger.Batch{NS: c.Namespace(), Ops: []ledger.Op{ledger.OpFunc(func(ctx context.Context, tx ledger.Tx) error {
			for j := range n {
				if err := reserveKey(ctx, tx, fmt.Sprintf("%s-%d-%d", tag, i, j), "e"); err != nil {
					return err
				}
			}
			return nil
		})}}
	}
	return batches
}

func TestStore_Write(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.URL(t)
	s := mustOpen(t, u, postgres.Options{})
	names := []string{"zeta", ledger.DefaultNamespace, "alpha"}
	var chains []*postgres.Chain
	for _, ns := range names {
		if ns != ledger.DefaultNamespace {
			if err := s.CreateNamespace(ctx, ns, ledger.NamespaceSettings{}); err != nil {
				t.Fatal(err)
			}
		}
		chains = append(chains, mustChain(t, s, ns))
	}

	// One transaction, each chain its own seq and head.
	if err := s.Write(ctx, groupOf(chains, 2, "first")); err != nil {
		t.Fatal(err)
	}
	for _, c := range chains {
		requireReceipts(t, c, 2)
	}

	// A batch that fails rolls the whole write back, and is named.
	parts := groupOf(chains, 1, "second")
	boom := errors.New("boom")
	parts = append(parts[:2], ledger.Batch{NS: chains[2].Namespace(), Ops: []ledger.Op{ledger.OpFunc(func(ctx context.Context, tx ledger.Tx) error {
		if err := reserveKey(ctx, tx, "second-doomed", "e"); err != nil {
			return err
		}
		return boom
	})}})
	var pe *ledger.PartError
	if err := s.Write(ctx, parts); !errors.As(err, &pe) || pe.Part != 2 || pe.Err != boom {
		t.Fatalf("a failing batch: got %v, want its error as is, naming it", err)
	}
	for _, c := range chains {
		requireReceipts(t, c, 2)
	}

	// Refused: a namespace twice, a namespace that does not exist.
	if err := s.Write(ctx, []ledger.Batch{{NS: "zeta"}, {NS: "zeta"}}); err == nil {
		t.Fatal("a write with one namespace twice ran")
	}
	if err := s.Write(ctx, []ledger.Batch{{NS: "nowhere"}}); !errors.Is(err, ledger.ErrUnknownNamespace) {
		t.Fatalf("a write to an unknown namespace: got %v", err)
	}
}

// TestStore_Write_Races: groups over overlapping namespaces, in
// every order, from two stores (replicas), beside single Updates: the
// head locks are taken in one order, so no deadlock, and every chain
// holds exactly what was acknowledged.
func TestStore_Write_Races(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.URL(t)
	a, b := mustOpen(t, u, postgres.Options{}), mustOpen(t, u, postgres.Options{})
	names := []string{ledger.DefaultNamespace, "n1", "n2", "n3"}
	for _, ns := range names[1:] {
		if err := a.CreateNamespace(ctx, ns, ledger.NamespaceSettings{}); err != nil {
			t.Fatal(err)
		}
	}
	var acked [4]atomic.Int64
	var wg sync.WaitGroup
	for w := range 6 {
		s := []*postgres.Store{a, b}[w%2]
		wg.Go(func() {
			for i := range 10 {
				// a rotating subset in a rotating order; every third a single Update
				var idx []int
				for k := range 1 + (w+i)%4 {
					idx = append(idx, (w+i+k*(1+w%3))%4)
				}
				idx = unique(idx)
				chains := make([]*postgres.Chain, len(idx))
				for k, j := range idx {
					chains[k] = mustChain(t, s, names[j])
				}
				parts := groupOf(chains, 1+i%2, fmt.Sprintf("w%d-i%d", w, i))
				var err error
				if i%3 == 2 {
					err = chains[0].Update(ctx, parts[0].Ops[0].Decide)
					idx = idx[:1]
				} else {
					err = s.Write(ctx, parts)
				}
				if err != nil {
					t.Error(err)
					return
				}
				for _, j := range idx {
					acked[j].Add(int64(1 + i%2))
				}
			}
		})
	}
	wg.Wait()
	for j, ns := range names {
		if got := len(checkChain(t, mustChain(t, a, ns))); int64(got) != acked[j].Load() {
			t.Errorf("%s: %d receipts, %d acknowledged", ns, got, acked[j].Load())
		}
	}
}

func unique(xs []int) []int {
	seen := map[int]bool{}
	var out []int
	for _, x := range xs {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

// TestLedger_GroupIsolation: through the domain, the batches of a
// namespace whose writes fail (a trigger refuses them) share groups with
// another namespace's, which still all succeed: a failing part rolls its
// group back and the others run again alone.
func TestLedger_GroupIsolation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	good, bad := refusingLedger(t)

	before := groupsOfMany(t)
	var okGood atomic.Int64
	for round := 0; round < 200 && (round == 0 || groupsOfMany(t) == before); round++ {
		var wg sync.WaitGroup
		for i := range 16 {
			n := []*ledger.Namespace{good, bad}[i%2]
			wg.Go(func() {
				_, err := n.Reserve(ctx, testkit.ReserveReq(fmt.Sprintf("key-%02d-%03d", round, i), "exec"))
				switch {
				case n == good && err != nil:
					t.Errorf("good namespace: %v", err)
				case n == good:
					okGood.Add(1)
				case err == nil:
					t.Error("bad namespace: a reserve succeeded")
				}
			})
		}
		wg.Wait()
	}
	if groupsOfMany(t) == before {
		t.Fatal("no group of two namespaces formed in 200 rounds")
	}
	requireReceipts(t, good.Reader().(ledger.Chain), int(okGood.Load()))
	requireReceipts(t, bad.Reader().(ledger.Chain), 0)
}

// refusingLedger opens the domain over a new database with namespaces
// good and bad, whose receipts the database refuses (a trigger).
func refusingLedger(t *testing.T) (good, bad *ledger.Namespace) {
	t.Helper()
	ctx := context.Background()
	u := pgtest.URL(t)
	l := ledger.New(mustOpen(t, u, postgres.Options{}), ledger.Config{})
	t.Cleanup(func() { _ = l.Close() })
	for _, ns := range []string{"good", "bad"} {
		if err := l.CreateNamespace(ctx, ns, ledger.NamespaceSettings{}); err != nil {
			t.Fatal(err)
		}
	}
	psql(t, u, `CREATE FUNCTION refuse_bad() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.namespace = 'bad' THEN
				RAISE EXCEPTION 'refused' USING ERRCODE = '23514';
			END IF;
			RETURN NEW;
		END $$`)
	psql(t, u, `CREATE TRIGGER refuse_bad BEFORE INSERT ON receipts FOR EACH ROW EXECUTE FUNCTION refuse_bad()`)
	return mustNS(t, l, "good"), mustNS(t, l, "bad")
}

func mustNS(t testing.TB, l *ledger.Ledger, name string) *ledger.Namespace {
	t.Helper()
	n, err := l.NS(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// groupsOfMany counts the groups of more than one namespace the process
// has run (ledger_writer_group_namespaces).
func groupsOfMany(t *testing.T) uint64 {
	t.Helper()
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "ledger_writer_group_namespaces" {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		for _, b := range h.GetBucket() {
			if b.GetUpperBound() == 1 {
				return h.GetSampleCount() - b.GetCumulativeCount()
			}
		}
	}
	return 0
}

// TestStore_Write_LostCommit: a group's COMMIT whose reply is lost
// is resolved by its first part's batch row for the whole group: found,
// no part runs again; not found (the COMMIT never arrived), every part
// runs again, once.
func TestStore_Write_LostCommit(t *testing.T) {
	ctx := context.Background()
	for _, committed := range []bool{true, false} {
		t.Run(fmt.Sprint("committed=", committed), func(t *testing.T) {
			u := pgtest.URL(t)
			proxy, pu := newCommitDropper(t, u)
			proxy.swallow = !committed
			s := mustOpen(t, pu, postgres.Options{})
			if err := s.CreateNamespace(ctx, "other", ledger.NamespaceSettings{}); err != nil {
				t.Fatal(err)
			}
			chains := []*postgres.Chain{mustChain(t, s, "other"), mustChain(t, s, ledger.DefaultNamespace)}
			var runs atomic.Int64
			parts := groupOf(chains, 1, "lost")
			for i := range parts {
				op := parts[i].Ops[0]
				parts[i].Ops[0] = ledger.OpFunc(func(ctx context.Context, tx ledger.Tx) error { runs.Add(1); return op.Decide(ctx, tx) })
			}
			proxy.armed.Store(true)
			if err := s.Write(ctx, parts); err != nil {
				t.Fatal(err)
			}
			want := int64(2)
			if !committed {
				want = 4
			}
			if proxy.dropped.Load() != 1 || runs.Load() != want {
				t.Fatalf("%d COMMITs dropped, the parts ran %d times; want 1 and %d", proxy.dropped.Load(), runs.Load(), want)
			}
			for _, c := range chains {
				requireReceipts(t, c, 1)
			}
		})
	}
}

// TestLedger_GroupIsolation_lonePart: a group whose one part with writes
// is refused pins the refusal on that part; the other parts (batches that
// write nothing: a policy set again unchanged) still succeed.
func TestLedger_GroupIsolation_lonePart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	good, bad := refusingLedger(t)
	before := groupsOfMany(t)
	for round := 0; round < 200 && (round < 3 || groupsOfMany(t) == before); round++ {
		var wg sync.WaitGroup
		for i := range 16 {
			wg.Go(func() {
				if i%2 == 1 {
					_, _ = bad.Reserve(ctx, testkit.ReserveReq(fmt.Sprintf("key-%02d-%03d", round, i), "exec"))
					return
				}
				if _, err := good.SetPolicy(ctx, json.RawMessage(`{}`), "ops"); err != nil {
					t.Errorf("good namespace, a batch that writes nothing: %v", err)
				}
			})
		}
		wg.Wait()
	}
	if groupsOfMany(t) == before {
		t.Fatal("no group of two namespaces formed in 200 rounds")
	}
}

// TestLedger_GroupTakesLateOps: requests a namespace queues while its
// batch waits for the next group join that batch when the group starts,
// instead of waiting for the group after it (ledger/group.go).
func TestLedger_GroupTakesLateOps(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.URL(t)
	s := mustOpen(t, u, postgres.Options{})
	if err := s.CreateNamespace(ctx, "late", ledger.NamespaceSettings{}); err != nil {
		t.Fatal(err)
	}
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	postgres.SetBeforeCommit(s, func(uint32) { once.Do(func() { close(held); <-release }) })
	l := ledger.New(s, ledger.Config{})
	t.Cleanup(func() { _ = l.Close() })
	reserve := func(n *ledger.Namespace, key string) <-chan error {
		done := make(chan error, 1)
		go func() {
			_, err := n.Reserve(ctx, testkit.ReserveReq(key, "exec"))
			done <- err
		}()
		return done
	}
	errs := []<-chan error{reserve(mustNS(t, l, ledger.DefaultNamespace), "key-default")}
	<-held // the default namespace's batch runs, alone, and waits before its COMMIT
	late := mustNS(t, l, "late")
	errs = append(errs, reserve(late, "key-late-1"))
	time.Sleep(200 * time.Millisecond) // its batch of one waits for the next group
	for i := 2; i <= 4; i++ {
		errs = append(errs, reserve(late, fmt.Sprintf("key-late-%d", i)))
	}
	time.Sleep(200 * time.Millisecond) // queued behind it
	close(release)
	for _, e := range errs {
		if err := <-e; err != nil {
			t.Fatal(err)
		}
	}
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var batches int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM batches WHERE namespace = 'late'`).Scan(&batches); err != nil {
		t.Fatal(err)
	}
	if batches != 1 {
		t.Fatalf("the 4 reserves of namespace late took %d transactions, want 1", batches)
	}
}
