package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/postgres"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/pgtest"
	"github.com/effect-ledger/effect-ledger/tlog"
)

func TestOpen_Schema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.URL(t)

	t.Run("ReadOnlyEmpty", func(t *testing.T) {
		_, err := postgres.Open(ctx, u, postgres.Options{ReadOnly: true})
		if !errors.Is(err, ledger.ErrNotLedger) {
			t.Fatalf("read-only open of an empty database: got %v, want ErrNotLedger", err)
		}
	})
	t.Run("CreateAndReopen", func(t *testing.T) {
		s := mustOpen(t, u, postgres.Options{})
		names, err := s.Namespaces(ctx)
		if err != nil || !slices.Equal(names, []string{ledger.DefaultNamespace}) {
			t.Fatalf("namespaces = %v, %v; want [default]", names, err)
		}
		update(t, mustChain(t, s, ledger.DefaultNamespace), func(ctx context.Context, tx ledger.Tx) error {
			return reserveKey(ctx, tx, "key-00001", "e1")
		})
		_ = s.Close()
		// Two stores opening at once both see one schema.
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				s2, err := postgres.Open(ctx, u, postgres.Options{})
				if err != nil {
					t.Errorf("reopen: %v", err)
					return
				}
				defer s2.Close()
				if h, err := mustChain(t, s2, ledger.DefaultNamespace).Head(ctx); err != nil || h.Seq != 1 {
					t.Errorf("head after reopen = %+v, %v; want seq 1", h, err)
				}
			})
		}
		wg.Wait()
		ro := mustOpen(t, u, postgres.Options{ReadOnly: true})
		err = mustChain(t, ro, ledger.DefaultNamespace).Update(ctx, func(context.Context, ledger.Tx) error { return nil })
		if !errors.Is(err, ledger.ErrOpenedReadOnly) {
			t.Fatalf("read-only Update: got %v, want ErrOpenedReadOnly", err)
		}
	})
	t.Run("ErrNewerVersion", func(t *testing.T) {
		psql(t, u, `UPDATE schema_version SET version = 7`)
		_, err := postgres.Open(ctx, u, postgres.Options{})
		if !errors.Is(err, ledger.ErrSchemaVersion) {
			t.Fatalf("got %v, want ErrSchemaVersion", err)
		}
		if msg := err.Error(); !strings.Contains(msg, "7") || !strings.Contains(msg, fmt.Sprint(postgres.SchemaVersion)) {
			t.Fatalf("error %q does not name both versions", msg)
		}
	})
}

func TestOpen_BadURL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const secret = "s3cr3t-pw"
	for _, tc := range []struct {
		desc, url   string
		unavailable bool
		mention     string
	}{
		{desc: "bad port", url: "postgres://ledger:" + secret + "@db.example:notaport/ledger", mention: "db.example"},
		{desc: "bad host", url: "postgresql://ledger:" + secret + "@[::1/ledger"},
		{desc: "bad escape", url: "postgres://ledger:" + secret + "%zz@host/ledger"},
		{desc: "slash in password", url: "postgres://ledger:" + secret + "/x@db.example:5432/ledger", mention: "db.example"},
		{desc: "not postgres", url: "mysql://ledger:" + secret + "@host/ledger"},
		{desc: "unreachable", url: "postgres://ledger:" + secret + "@127.0.0.1:1/ledgerdb?connect_timeout=2",
			unavailable: true, mention: "ledgerdb"},
		{desc: "password parameter", url: "postgres://ledger@127.0.0.1:1/ledgerdb?password=" + secret + "&connect_timeout=2",
			unavailable: true, mention: "127.0.0.1"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			s, err := postgres.Open(ctx, tc.url, postgres.Options{})
			if err == nil {
				_ = s.Close()
				t.Fatal("Open succeeded")
			}
			msg := err.Error()
			t.Log(msg)
			if strings.Contains(msg, secret) {
				t.Fatalf("error shows the password: %s", msg)
			}
			if tc.mention != "" && !strings.Contains(msg, tc.mention) {
				t.Errorf("error %q does not name %s", msg, tc.mention)
			}
			if tc.unavailable != errors.Is(err, ledger.ErrUnavailable) {
				t.Errorf("errors.Is(%v, ErrUnavailable) = %v, want %v", err, !tc.unavailable, tc.unavailable)
			}
		})
	}
	if got := postgres.Redact("postgres://u:" + secret + "@h/db?password=" + secret); strings.Contains(got, secret) {
		t.Errorf("Redact = %s", got)
	}
}

func TestChain_Update(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.URL(t)
	s, c := mustOpenDefault(t, u, postgres.Options{})

	var runs int
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		runs++
		if h := locked(tx).Head; h.Seq != 0 || h.Hash != (chain.Hash{}) {
			return fmt.Errorf("empty head = %+v", h)
		}
		if locked(tx).Now == 0 || locked(tx).Now > uint64(time.Now().Add(time.Minute).UnixMilli()) {
			return fmt.Errorf("Now = %d", locked(tx).Now)
		}
		for i := range 5 {
			if _, err := reserve(ctx, tx, call{key: fmt.Sprintf("key-%05d", i), exec: "e", tool: "t"}, 60000); err != nil {
				return err
			}
		}
		if _, err := finish(ctx, tx, "key-00001", chain.OutcomeSucceeded, ""); err != nil {
			return err
		}
		if locked(tx).Head.Seq != 6 {
			return fmt.Errorf("head in tx = %d", locked(tx).Head.Seq)
		}
		return nil
	})
	if runs != 1 {
		t.Fatalf("fn ran %d times", runs)
	}
	for range 3 { // batches of 1 … 3
		update(t, c, func(ctx context.Context, tx ledger.Tx) error {
			_, err := reserve(ctx, tx, call{key: "key-00001", exec: "e2", tool: "t"}, 60000)
			return err
		})
	}
	rs := checkChain(t, c)
	if len(rs) != 9 {
		t.Fatalf("%d receipts, want 9", len(rs))
	}

	t.Run("ErrFn", func(t *testing.T) {
		boom := errors.New("boom")
		err := c.Update(ctx, func(ctx context.Context, tx ledger.Tx) error {
			if _, err := reserve(ctx, tx, call{key: "key-lost1", exec: "e", tool: "t"}, 1); err != nil {
				return err
			}
			return boom
		})
		if err != boom {
			t.Fatalf("got %v, want fn's error as is", err)
		}
		if got := len(checkChain(t, c)); got != 9 {
			t.Fatalf("%d receipts after a failed fn, want 9", got)
		}
	})
	t.Run("ErrNotLinked", func(t *testing.T) {
		err := c.Update(ctx, func(ctx context.Context, tx ledger.Tx) error {
			r := chain.Link(locked(tx).Head.Seq+1, locked(tx).Head.Hash, chain.Receipt{Kind: chain.KindReserve})
			return tx.Append(ctx, &r, nil)
		})
		if err == nil {
			t.Fatal("a receipt that skips a seq was appended")
		}
	})
	t.Run("ErrNUL", func(t *testing.T) {
		err := c.Update(ctx, func(ctx context.Context, tx ledger.Tx) error {
			_, err := appendReceipt(ctx, tx, chain.Receipt{Kind: chain.KindReserve, IdempotencyKey: "key-nul01",
				ErrorMessage: "a\x00b"})
			return err
		})
		if ledger.ErrorCode(err) != ledger.ECodeInvalidRequest {
			t.Fatalf("got %v, want invalid_request", err)
		}
	})
	t.Run("Checkpoint", func(t *testing.T) {
		root, err := tlog.TreeHash(5, c.HashReader(ctx))
		if err != nil {
			t.Fatal(err)
		}
		var signedAt uint64
		update(t, c, func(ctx context.Context, tx ledger.Tx) error {
			cp := &tlog.Signed{Size: 5, Root: root, Note: "note 5"}
			err := tx.PutCheckpoint(ctx, cp)
			signedAt = cp.SignedAt
			return err
		})
		for _, size := range []int64{5, 4} {
			err := c.Update(ctx, func(ctx context.Context, tx ledger.Tx) error {
				return tx.PutCheckpoint(ctx, &tlog.Signed{Size: size, Root: root, Note: "again"})
			})
			if !errors.Is(err, ledger.ErrStaleCheckpoint) {
				t.Fatalf("checkpoint %d after 5: got %v, want ErrStaleCheckpoint", size, err)
			}
		}
		got, err := c.LatestCheckpoint(ctx)
		if err != nil || got == nil || got.Size != 5 || got.Root != root || got.Note != "note 5" || got.SignedAt != signedAt {
			t.Fatalf("latest checkpoint = %+v, %v", got, err)
		}
		if got, err := c.CheckpointCovering(ctx, 3); err != nil || got == nil || got.Size != 5 {
			t.Fatalf("covering 3 = %+v, %v", got, err)
		}
		if got, err := c.CheckpointAt(ctx, 4); err != nil || got != nil {
			t.Fatalf("at 4 = %+v, %v; want none", got, err)
		}
	})
	t.Run("ErrAppendOnly", func(t *testing.T) {
		conn := connect(t, u)
		defer func() { _ = conn.Close(ctx) }()
		for _, q := range []string{
			`UPDATE receipts SET note = 'x' WHERE seq = 1`,
			`DELETE FROM receipts WHERE seq = 9`,
			`TRUNCATE receipts CASCADE`,
			`DELETE FROM tree_hashes`,
			`UPDATE head SET seq = 3, hash = (SELECT hash FROM receipts WHERE seq = 3)`,
			`UPDATE head SET seq = 10, hash = '\x` + strings.Repeat("00", 32) + `'`,
		} {
			if _, err := conn.Exec(ctx, q); err == nil {
				t.Errorf("%s: allowed", q)
			}
		}
	})
	t.Run("ReceiptHashes", func(t *testing.T) {
		hs, err := c.ReceiptHashes(ctx, 7, 10)
		if err != nil || len(hs) != 2 || hs[0] != rs[7].Hash || hs[1] != rs[8].Hash {
			t.Fatalf("ReceiptHashes(7, 10) = %v, %v", hs, err)
		}
	})
	t.Run("Probe", func(t *testing.T) {
		update(t, c, func(ctx context.Context, tx ledger.Tx) error { return tx.Probe(ctx) })
		if err := s.Ready(ctx); err != nil {
			t.Fatalf("Ready: %v", err)
		}
	})
}

func TestTx_Preload(t *testing.T) {
	t.Parallel()
	s, c := mustOpenDefault(t, pgtest.URL(t), postgres.Options{})
	var reserved chain.Receipt
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		var err error
		if reserved, err = reserve(ctx, tx, call{key: "key-00001", exec: "e", tool: "t"}, 1000); err != nil {
			return err
		}
		_, err = finish(ctx, tx, "key-00001", chain.OutcomeSucceeded, "")
		return err
	})
	// The keys of a batch are read with its head, in the transaction's
	// first round trip.
	err := s.Write(context.Background(), []ledger.Batch{{NS: ledger.DefaultNamespace, Keys: []string{"key-00001", "key-absent"},
		Ops: []ledger.Op{ledger.OpFunc(func(ctx context.Context, tx ledger.Tx) error {
			k, found, err := tx.Key(ctx, "key-00001")
			if err != nil || !found || k.ReserveSeq != 1 || k.FinalSeq != 2 || k.TokenHash != "token-e" {
				return fmt.Errorf("preloaded key = %+v %v %v", k, found, err)
			}
			if r, err := tx.Receipt(ctx, 1); err != nil || r.Hash != reserved.Hash {
				return fmt.Errorf("preloaded receipt = %+v %v", r, err)
			}
			if _, found, err := tx.Key(ctx, "key-absent"); err != nil || found {
				return fmt.Errorf("absent key: found %v, %v", found, err)
			}
			// Writes of the transaction win over what was preloaded.
			if _, err := reserve(ctx, tx, call{key: "key-absent", exec: "e2", tool: "t"}, 1000); err != nil {
				return err
			}
			if k, found, err := tx.Key(ctx, "key-absent"); err != nil || !found || k.ReserveSeq != 3 {
				return fmt.Errorf("key written after preload = %+v %v %v", k, found, err)
			}
			return nil
		})}}})
	if err != nil {
		t.Fatal(err)
	}
	checkChain(t, c)
}

func TestChain_Update_Now(t *testing.T) {
	t.Parallel()
	u := pgtest.URL(t)
	fixed := time.UnixMilli(testkit.T0)
	_, c := mustOpenDefault(t, u, postgres.Options{Now: func() time.Time { return fixed }})
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		if locked(tx).Now != testkit.T0 {
			return fmt.Errorf("Now = %d with Options.Now", locked(tx).Now)
		}
		return reserveKey(ctx, tx, "key-00001", "e")
	})
	// The database clock is later, and never before the last receipt.
	s2 := mustOpen(t, u, postgres.Options{})
	update(t, mustChain(t, s2, ledger.DefaultNamespace), func(ctx context.Context, tx ledger.Tx) error {
		if locked(tx).Now < testkit.T0 || locked(tx).Now < uint64(time.Now().Add(-time.Minute).UnixMilli()) {
			return fmt.Errorf("database Now = %d", locked(tx).Now)
		}
		return nil
	})
}

func TestChain_Update_TwoStores(t *testing.T) {
	t.Parallel()
	u := pgtest.URL(t)
	a, b := mustOpen(t, u, postgres.Options{}), mustOpen(t, u, postgres.Options{})
	ctx := context.Background()
	if err := a.CreateNamespace(ctx, "other", ledger.NamespaceSettings{}); err != nil {
		t.Fatal(err)
	}
	const workers, batches = 4, 12
	var wg sync.WaitGroup
	var appended atomic.Int64
	for w := range 2 * workers {
		s := []*postgres.Store{a, b}[w%2]
		wg.Go(func() {
			for i := range batches {
				ns := ledger.DefaultNamespace
				if i%4 == 3 {
					ns = "other"
				}
				c, err := s.Chain(ctx, ns)
				if err != nil {
					t.Error(err)
					return
				}
				n := 1 + (w+i)%3
				err = c.(*postgres.Chain).Update(ctx, func(ctx context.Context, tx ledger.Tx) error {
					for j := range n {
						if _, err := reserve(ctx, tx, call{key: fmt.Sprintf("key-%d-%d-%d", w, i, j), exec: "e", tool: "t"}, 1000); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					t.Error(err)
					return
				}
				appended.Add(int64(n))
			}
		})
	}
	wg.Wait()
	na := len(checkChain(t, mustChain(t, a, ledger.DefaultNamespace)))
	nb := len(checkChain(t, mustChain(t, b, "other")))
	if int64(na+nb) != appended.Load() {
		t.Fatalf("%d + %d receipts, %d appended", na, nb, appended.Load())
	}
}

func TestStore_Namespaces(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := mustOpen(t, pgtest.URL(t), postgres.Options{})
	if _, err := s.Chain(ctx, "nope"); !errors.Is(err, ledger.ErrUnknownNamespace) {
		t.Fatalf("Chain(nope): got %v, want ErrUnknownNamespace", err)
	}
	if err := s.CreateNamespace(ctx, "pay.ments_1-x", ledger.NamespaceSettings{}); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateNamespace(ctx, "pay.ments_1-x", ledger.NamespaceSettings{}); !errors.Is(err, ledger.ErrNamespaceExists) {
		t.Fatalf("second create: got %v, want ErrNamespaceExists", err)
	}
	if err := s.CreateNamespace(ctx, "Bad!", ledger.NamespaceSettings{}); err == nil {
		t.Fatal("created namespace Bad!")
	}
	names, err := s.Namespaces(ctx)
	if err != nil || !slices.Equal(names, []string{"default", "pay.ments_1-x"}) {
		t.Fatalf("namespaces = %v, %v", names, err)
	}
	// One key in two namespaces is two effects, each its own seq 1.
	for _, ns := range names {
		c := mustChain(t, s, ns)
		update(t, c, func(ctx context.Context, tx ledger.Tx) error {
			return reserveKey(ctx, tx, "same-key-1", "e-"+ns)
		})
		rs := checkChain(t, c)
		if len(rs) != 1 || rs[0].ExecutionID != "e-"+ns {
			t.Fatalf("%s: receipts %+v", ns, rs)
		}
	}
}

// injectOnce makes the next receipts INSERT of the database fail once
// with SQLSTATE code.
func injectOnce(t *testing.T, u, code string) {
	t.Helper()
	psql(t, u, `CREATE SEQUENCE inject_once`)
	psql(t, u, `CREATE FUNCTION inject_once() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF nextval('inject_once') = 1 THEN
				RAISE EXCEPTION 'injected failure' USING ERRCODE = '`+code+`';
			END IF;
			RETURN NEW;
		END $$`)
	psql(t, u, `CREATE TRIGGER inject_once BEFORE INSERT ON receipts FOR EACH ROW EXECUTE FUNCTION inject_once()`)
}

func TestChain_Update_Retry(t *testing.T) {
	t.Parallel()
	for _, code := range []string{"40001", "40P01"} {
		t.Run(code, func(t *testing.T) {
			u := pgtest.URL(t)
			_, c := mustOpenDefault(t, u, postgres.Options{})
			injectOnce(t, u, code)
			var runs int
			update(t, c, func(ctx context.Context, tx ledger.Tx) error {
				runs++
				if locked(tx).Head.Seq != 0 {
					return fmt.Errorf("run %d starts at head %d", runs, locked(tx).Head.Seq)
				}
				return reserveKey(ctx, tx, "key-00001", "e")
			})
			if runs != 2 {
				t.Errorf("fn ran %d times, want 2", runs)
			}
			requireReceipts(t, c, 1)
		})
	}
	t.Run("ErrServerRefusal", func(t *testing.T) {
		u := pgtest.URL(t)
		_, c := mustOpenDefault(t, u, postgres.Options{})
		injectOnce(t, u, "23514")
		var runs int
		err := c.Update(context.Background(), func(ctx context.Context, tx ledger.Tx) error {
			runs++
			return reserveKey(ctx, tx, "key-00001", "e")
		})
		if err == nil || runs != 1 {
			t.Fatalf("a check violation: err %v after %d runs; want an error after 1", err, runs)
		}
		requireReceipts(t, c, 0)
	})
}

func TestChain_Update_LostCommit(t *testing.T) {
	ctx := context.Background()
	t.Run("NotSent", func(t *testing.T) {
		// The writer's backend is terminated just before COMMIT: the
		// COMMIT cannot be sent, so fn runs again.
		u := pgtest.URL(t)
		s, c := mustOpenDefault(t, u, postgres.Options{})
		var killed atomic.Bool
		postgres.SetBeforeCommit(s, func(pid uint32) {
			if killed.CompareAndSwap(false, true) {
				psql(t, u, `SELECT pg_terminate_backend($1::int, 5000)`, int64(pid))
			}
		})
		var runs int
		update(t, c, func(ctx context.Context, tx ledger.Tx) error {
			runs++
			return reserveKey(ctx, tx, "key-00001", fmt.Sprint("run-", runs))
		})
		if runs != 2 {
			t.Errorf("fn ran %d times, want 2", runs)
		}
		requireSecondRun(t, c)
	})
	t.Run("NotCommitted", func(t *testing.T) {
		// The COMMIT is lost on its way and the connection drops: the
		// driver cannot know whether it committed, resolves it as not
		// committed, and runs fn again.
		u := pgtest.URL(t)
		proxy, pu := newCommitDropper(t, u)
		proxy.swallow = true
		_, c := mustOpenDefault(t, pu, postgres.Options{})
		proxy.armed.Store(true)
		var runs int
		update(t, c, func(ctx context.Context, tx ledger.Tx) error {
			runs++
			return reserveKey(ctx, tx, "key-00001", fmt.Sprint("run-", runs))
		})
		if proxy.dropped.Load() != 1 || runs != 2 {
			t.Fatalf("%d COMMITs dropped, fn ran %d times; want 1 and 2", proxy.dropped.Load(), runs)
		}
		requireSecondRun(t, c)
	})
	t.Run("Committed", func(t *testing.T) {
		// The COMMIT reaches the server but its reply is lost: the driver
		// finds the batch committed and does not run fn again.
		u := pgtest.URL(t)
		proxy, pu := newCommitDropper(t, u)
		_, c := mustOpenDefault(t, pu, postgres.Options{})
		update(t, c, func(ctx context.Context, tx ledger.Tx) error {
			return reserveKey(ctx, tx, "key-00001", "e")
		})
		proxy.armed.Store(true)
		var runs int
		update(t, c, func(ctx context.Context, tx ledger.Tx) error {
			runs++
			return reserveKey(ctx, tx, "key-00002", "e")
		})
		if proxy.dropped.Load() != 1 {
			t.Fatalf("the proxy dropped %d COMMIT replies, want 1", proxy.dropped.Load())
		}
		if runs != 1 {
			t.Errorf("fn ran %d times, want 1", runs)
		}
		requireReceipts(t, c, 2)
	})
	t.Run("ErrCommitUnknown", func(t *testing.T) {
		// The reply is lost and the database stays unreachable.
		cl := pgtest.StartCluster(t)
		u := cl.URL(t)
		s, c := mustOpenDefault(t, u, postgres.Options{})
		restore := postgres.SetResolveBudget(time.Second)
		defer restore()
		postgres.SetBeforeCommit(s, func(uint32) {
			if err := cl.Stop(); err != nil {
				t.Error(err)
			}
		})
		err := c.Update(ctx, func(ctx context.Context, tx ledger.Tx) error {
			return reserveKey(ctx, tx, "key-00001", "e")
		})
		if !errors.Is(err, ledger.ErrCommitUnknown) || !errors.Is(err, ledger.ErrUnavailable) {
			t.Fatalf("got %v, want ErrCommitUnknown", err)
		}
		postgres.SetBeforeCommit(s, nil)
		if err := s.Ready(ctx); !errors.Is(err, ledger.ErrUnavailable) {
			t.Fatalf("Ready with the database down: got %v, want ErrUnavailable", err)
		}
		var runs int
		err = c.Update(ctx, func(context.Context, ledger.Tx) error { runs++; return nil })
		if !errors.Is(err, ledger.ErrUnavailable) || errors.Is(err, ledger.ErrCommitUnknown) || runs != 0 {
			t.Fatalf("Update with the database down: got %v after %d runs, want ErrUnavailable", err, runs)
		}
		if _, err := c.Head(ctx); !errors.Is(err, ledger.ErrUnavailable) {
			t.Fatalf("Head with the database down: got %v, want ErrUnavailable", err)
		}
		if err := cl.Start(); err != nil {
			t.Fatal(err)
		}
		// pgxpool redials: the store recovers alone.
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.NoError(c, s.Ready(ctx), "Ready after restart")
		}, 10*time.Second, 50*time.Millisecond)
		if n := len(checkChain(t, c)); n != 0 {
			t.Fatalf("%d receipts, want 0 (the server was stopped before COMMIT)", n)
		}
	})
}

func TestChain_Update_ConnectionLost(t *testing.T) {
	t.Parallel()
	// The writer's connection dies in the middle of fn: the run is rolled
	// back by the server and fn runs again on another connection.
	u := pgtest.URL(t)
	_, c := mustOpenDefault(t, u, postgres.Options{})
	var runs int
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		runs++
		if _, err := reserve(ctx, tx, call{key: "key-00001", exec: fmt.Sprint("run-", runs), tool: "t"}, 1000); err != nil {
			return err
		}
		if runs == 1 {
			psql(t, u, `SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity
				WHERE datname = current_database() AND pid <> pg_backend_pid() AND application_name = 'ledgerd'
				  AND state = 'idle in transaction'`)
		}
		_, _, err := tx.Key(ctx, "key-00002")
		return err
	})
	if runs != 2 {
		t.Errorf("fn ran %d times, want 2", runs)
	}
	requireSecondRun(t, c)
}

func TestChain_Update_Context(t *testing.T) {
	t.Parallel()
	_, c := mustOpenDefault(t, pgtest.URL(t), postgres.Options{})
	t.Run("CancelledInFn", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		err := c.Update(ctx, func(ctx context.Context, tx ledger.Tx) error {
			if _, err := reserve(ctx, tx, call{key: "key-00001", exec: "e", tool: "t"}, 1000); err != nil {
				return err
			}
			cancel()
			return nil
		})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v, want context.Canceled", err)
		}
		requireReceipts(t, c, 0)
	})
	t.Run("CancelledBefore", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := c.Update(ctx, func(context.Context, ledger.Tx) error { return errors.New("ran") })
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v, want context.Canceled", err)
		}
	})
	t.Run("WaitsForLock", func(t *testing.T) {
		// A second Update of the namespace waits for the first's lock; its
		// context ends the wait.
		held, release := make(chan struct{}), make(chan struct{})
		go func() {
			_ = c.Update(context.Background(), func(context.Context, ledger.Tx) error {
				close(held)
				<-release
				return nil
			})
		}()
		<-held
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		err := c.Update(ctx, func(context.Context, ledger.Tx) error { return nil })
		close(release)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got %v, want context.DeadlineExceeded", err)
		}
		update(t, c, func(context.Context, ledger.Tx) error { return nil })
	})
}

// TestStore_AnalyzesYoungTables: the writer analyzes the ledger's tables
// while they grow from empty (analyze.go), long before autovacuum would,
// so that the pool's generic plans are made on statistics of their real
// size.
func TestStore_AnalyzesYoungTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.URL(t)
	_, c := mustOpenDefault(t, u, postgres.Options{})
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	analyzed := func() bool {
		var n int64
		if err := conn.QueryRow(ctx, `SELECT analyze_count FROM pg_stat_user_tables WHERE relid = 'receipts'::regclass`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; !analyzed(); i++ {
		if time.Now().After(deadline) {
			t.Fatalf("receipts not analyzed after %d updates", i*100)
		}
		for j := range 100 {
			update(t, c, func(ctx context.Context, tx ledger.Tx) error {
				return reserveKey(ctx, tx, fmt.Sprintf("key-%04d-%03d", i, j), "exec")
			})
		}
	}
}

// TestStore_AnalyzeRefused: a role that may write the ledger's tables but
// does not own them cannot ANALYZE them; the store says so once and keeps
// writing (autovacuum keeps the statistics then).
func TestStore_AnalyzeRefused(t *testing.T) {
	t.Parallel()
	u := pgtest.URL(t)
	mustOpen(t, u, postgres.Options{}) // the schema, made by its owner
	role := fmt.Sprintf("writer_%d", time.Now().UnixNano())
	for _, q := range []string{
		`CREATE ROLE ` + role + ` LOGIN`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO ` + role,
		`GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO ` + role,
	} {
		psql(t, u, q)
	}
	ru, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	ru.User = url.User(role)
	var logs testkit.Buffer
	_, c := mustOpenDefault(t, ru.String(), postgres.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	const warning = "cannot analyze the ledger's young tables"
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; !strings.Contains(logs.String(), warning); i++ {
		if time.Now().After(deadline) {
			t.Fatalf("no warning after %d updates; logs:\n%s", i*100, logs.String())
		}
		for j := range 100 {
			update(t, c, func(ctx context.Context, tx ledger.Tx) error {
				return reserveKey(ctx, tx, fmt.Sprintf("key-%04d-%03d", i, j), "exec")
			})
		}
	}
	for j := range 600 { // enough changes for another look, a second later
		update(t, c, func(ctx context.Context, tx ledger.Tx) error {
			return reserveKey(ctx, tx, fmt.Sprintf("more-%04d", j), "exec")
		})
	}
	time.Sleep(1100 * time.Millisecond)
	update(t, c, func(ctx context.Context, tx ledger.Tx) error { return reserveKey(ctx, tx, "last-key", "exec") })
	time.Sleep(200 * time.Millisecond)
	if n := strings.Count(logs.String(), warning); n != 1 {
		t.Fatalf("the warning was logged %d times, want once:\n%s", n, logs.String())
	}
}
