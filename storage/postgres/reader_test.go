package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/postgres"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/pgtest"
)

// readFixture writes, at a clock the test controls:
//
//	1 reserve key-b0001 pay/aa   2 commit key-b0001 succeeded   3 reserve key-a0001 pay/aa
//	4 commit key-a0001 succeeded 5 reserve Key-Z0001 mail/bb    6 commit Key-Z0001 failed
//	7 reserve key-c0001 mail/bb  8 reserve key-d0001 (lease 1 min) 9 reserve key-e0001 (lease 1 ms)
//	10 replay key-b0001
func readFixture(t *testing.T) (*postgres.Chain, string, *testkit.Clock) {
	t.Helper()
	u := pgtest.URL(t)
	clock := testkit.NewClock()
	_, c := mustOpenDefault(t, u, postgres.Options{Now: clock.Now})
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		steps := []func() error{
			func() error {
				_, err := reserve(ctx, tx, call{key: "key-b0001", exec: "e1", tool: "pay", input: "sha256:aa"}, 1000)
				return err
			},
			func() error { _, err := finish(ctx, tx, "key-b0001", chain.OutcomeSucceeded, ""); return err },
			func() error {
				_, err := reserve(ctx, tx, call{key: "key-a0001", exec: "e2", tool: "pay", input: "sha256:aa"}, 1000)
				return err
			},
			func() error { _, err := finish(ctx, tx, "key-a0001", chain.OutcomeSucceeded, ""); return err },
			func() error {
				_, err := reserve(ctx, tx, call{key: "Key-Z0001", exec: "e3", tool: "mail", input: "sha256:bb"}, 1000)
				return err
			},
			func() error { _, err := finish(ctx, tx, "Key-Z0001", chain.OutcomeFailed, "smtp_down"); return err },
			func() error {
				_, err := reserve(ctx, tx, call{key: "key-c0001", exec: "e4", tool: "mail", input: "sha256:bb"}, 1000)
				return err
			},
			func() error {
				_, err := reserve(ctx, tx, call{key: "key-d0001", exec: "e5", tool: "pay"}, 60000)
				return err
			},
			func() error {
				_, err := reserve(ctx, tx, call{key: "key-e0001", exec: "e6", tool: "pay"}, 1)
				return err
			},
			func() error {
				r := call{key: "key-b0001", exec: "e7", tool: "pay", input: "sha256:aa"}.receipt(chain.KindReplay)
				r.RefSeq = 2
				_, err := appendReceipt(ctx, tx, r)
				return err
			},
		}
		for _, f := range steps {
			if err := f(); err != nil {
				return err
			}
		}
		return nil
	})
	clock.Advance(10 * time.Millisecond) // key-e0001's lease has ended, key-d0001's has not
	return c, u, clock
}

func seqs(rs []chain.Receipt) []uint64 {
	out := make([]uint64, len(rs))
	for i := range rs {
		out[i] = rs[i].Seq
	}
	return out
}

func TestChain_Reads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, u, _ := readFixture(t)
	checkChain(t, c)

	t.Run("ListReceipts", func(t *testing.T) {
		for _, tc := range []struct {
			desc string
			f    ledger.ReceiptFilter
			want []uint64
			next uint64
		}{
			{desc: "all", f: ledger.ReceiptFilter{}, want: []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}},
			{desc: "key", f: ledger.ReceiptFilter{Key: "key-b0001"}, want: []uint64{1, 2, 10}},
			{desc: "tool", f: ledger.ReceiptFilter{Tool: "mail"}, want: []uint64{5, 6, 7}},
			{desc: "kind", f: ledger.ReceiptFilter{Kind: chain.KindCommit}, want: []uint64{2, 4, 6}},
			{desc: "execution", f: ledger.ReceiptFilter{ExecutionID: "e3"}, want: []uint64{5, 6}},
			{desc: "combined", f: ledger.ReceiptFilter{Tool: "pay", Kind: chain.KindReserve, After: 3}, want: []uint64{8, 9}},
			{desc: "page", f: ledger.ReceiptFilter{Tool: "pay", Limit: 2}, want: []uint64{1, 2}, next: 2},
			{desc: "next page", f: ledger.ReceiptFilter{Tool: "pay", Limit: 2, After: 2}, want: []uint64{3, 4}, next: 4},
			{desc: "last page", f: ledger.ReceiptFilter{Tool: "pay", Limit: 4, After: 4}, want: []uint64{8, 9, 10}},
		} {
			rs, next, err := c.ListReceipts(ctx, tc.f)
			if err != nil {
				t.Fatalf("%s: %v", tc.desc, err)
			}
			if !slices.Equal(seqs(rs), tc.want) {
				t.Errorf("%s: seqs %v, want %v", tc.desc, seqs(rs), tc.want)
			}
			if (next == nil) != (tc.next == 0) || next != nil && *next != tc.next {
				t.Errorf("%s: next %v, want %d", tc.desc, next, tc.next)
			}
		}
		for _, f := range []ledger.ReceiptFilter{{Limit: -1}, {Limit: ledger.MaxPageLimit + 1}, {Kind: "other"}} {
			if _, _, err := c.ListReceipts(ctx, f); ledger.ErrorCode(err) != ledger.ECodeInvalidRequest {
				t.Errorf("ListReceipts(%+v): got %v, want invalid_request", f, err)
			}
		}
	})
	t.Run("GetReceipt", func(t *testing.T) {
		r, err := c.GetReceipt(ctx, 2)
		if err != nil || r.Seq != 2 || r.Kind != chain.KindCommit || r.Result != `{"ok":true}` || r.Check() != nil {
			t.Fatalf("GetReceipt(2) = %+v, %v", r, err)
		}
		if _, err := c.GetReceipt(ctx, 11); ledger.ErrorCode(err) != ledger.ECodeUnknownReceipt {
			t.Fatalf("GetReceipt(11): got %v, want unknown_receipt", err)
		}
	})
	t.Run("GetKey", func(t *testing.T) {
		for _, tc := range []struct {
			key   string
			state ledger.State
			seqs  []uint64
		}{
			{"key-b0001", ledger.StateSucceeded, []uint64{1, 2, 10}},
			{"Key-Z0001", ledger.StateFailed, []uint64{5, 6}},
			{"key-d0001", ledger.StateReserved, []uint64{8}},
			{"key-e0001", ledger.StateInterrupted, []uint64{9}},
		} {
			v, err := c.GetKey(ctx, tc.key)
			if err != nil {
				t.Fatalf("GetKey(%s): %v", tc.key, err)
			}
			if v.State != tc.state || !slices.Equal(seqs(v.Receipts), tc.seqs) || v.IdempotencyKey != tc.key {
				t.Errorf("GetKey(%s) = %s %v, want %s %v", tc.key, v.State, seqs(v.Receipts), tc.state, tc.seqs)
			}
		}
		if v, _ := c.GetKey(ctx, "key-b0001"); v.Tool != "pay" || v.InputHash != "sha256:aa" || v.Effect != chain.EffectWrite {
			t.Errorf("GetKey fingerprint = %+v", v)
		}
		for key, code := range map[string]string{"key-none1": ledger.ECodeUnknownKey, "short": ledger.ECodeUnknownKey,
			"key with space": ledger.ECodeInvalidKey} {
			if _, err := c.GetKey(ctx, key); ledger.ErrorCode(err) != code {
				t.Errorf("GetKey(%q): got %v, want %s", key, err, code)
			}
		}
	})
	t.Run("Keys", func(t *testing.T) {
		var got []string
		err := c.Keys(ctx, func(k *ledger.KeyRecord) error {
			if k.TokenHash != "" {
				return fmt.Errorf("key %s has a token hash", k.Key)
			}
			got = append(got, k.Key)
			return nil
		})
		want := []string{"Key-Z0001", "key-a0001", "key-b0001", "key-c0001", "key-d0001", "key-e0001"}
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("Keys = %v, %v; want %v (byte order)", got, err, want)
		}
	})
	t.Run("KeyReceipts", func(t *testing.T) {
		for _, tc := range []struct {
			after uint64
			want  []uint64
		}{
			{0, []uint64{5, 6, 3, 4, 1, 2, 10, 7, 8, 9}},
			{8, []uint64{1, 2, 10, 9}},
		} {
			var got []uint64
			if err := c.KeyReceipts(ctx, tc.after, func(r *chain.Receipt) error {
				got = append(got, r.Seq)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("KeyReceipts(%d) = %v, want %v", tc.after, got, tc.want)
			}
		}
		stop := errors.New("stop")
		if err := c.KeyReceipts(ctx, 0, func(*chain.Receipt) error { return stop }); err != stop {
			t.Errorf("fn's error: got %v", err)
		}
	})
	t.Run("Receipts", func(t *testing.T) {
		var got []uint64
		if err := c.Receipts(ctx, 7, func(r *chain.Receipt) error {
			got = append(got, r.Seq)
			return nil
		}); err != nil || !slices.Equal(got, []uint64{8, 9, 10}) {
			t.Fatalf("Receipts(7) = %v, %v", got, err)
		}
	})
	t.Run("DuplicateSuccesses", func(t *testing.T) {
		var got []ledger.Success
		if err := c.DuplicateSuccesses(ctx, func(s *ledger.Success) error {
			got = append(got, *s)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || got[0].Key != "key-b0001" || got[0].Seq != 2 || got[1].Key != "key-a0001" || got[1].Seq != 4 ||
			got[0].Tool != "pay" || got[0].InputHash != "sha256:aa" || got[0].RecordedAt != testkit.T0 {
			t.Fatalf("DuplicateSuccesses = %+v", got)
		}
	})
	t.Run("RepeatedFailures", func(t *testing.T) {
		mail := []ledger.CallAfterFailure{
			{Tool: "mail", InputHash: "sha256:bb", Failure: true, Key: "Key-Z0001", ExecutionID: "e3", ErrorCode: "smtp_down", Seq: 6, RecordedAt: testkit.T0},
			{Tool: "mail", InputHash: "sha256:bb", Key: "key-c0001", ExecutionID: "e4", Seq: 7, RecordedAt: testkit.T0},
		}
		for _, tc := range []struct {
			tool string
			want []ledger.CallAfterFailure
		}{{"", mail}, {"mail", mail}, {"pay", nil}} {
			var got []ledger.CallAfterFailure
			if err := c.RepeatedFailures(ctx, tc.tool, func(f *ledger.CallAfterFailure) error {
				got = append(got, *f)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("RepeatedFailures(%q) = %+v, want %+v", tc.tool, got, tc.want)
			}
		}
	})
	t.Run("KeyDrift", func(t *testing.T) {
		for _, key := range []string{"key-b0001", "Key-Z0001", "key-e0001"} {
			if d, err := c.KeyDrift(ctx, key); err != nil || len(d) != 0 {
				t.Fatalf("KeyDrift(%s) = %v, %v; want none", key, d, err)
			}
		}
		// An edit by someone who disabled the keys guard first.
		psql(t, u, `ALTER TABLE keys DISABLE TRIGGER USER`)
		psql(t, u, `UPDATE keys SET final_seq = 0 WHERE idempotency_key = 'key-b0001'`)
		d, err := c.KeyDrift(ctx, "key-b0001")
		if err != nil || len(d) != 2 {
			t.Fatalf("KeyDrift after an edit = %q, %v; want stored and derived", d, err)
		}
	})
}

func TestStore_Tokens(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.URL(t)
	ts := mustOpen(t, u, postgres.Options{}).Tokens()
	if ok, err := ts.AnyValidToken(ctx); err != nil || ok {
		t.Fatalf("AnyValidToken on none = %v, %v", ok, err)
	}
	rows := []ledger.TokenRow{
		{ID: "aaaaaaaaaaaa", Name: "ops", Role: ledger.RoleAdmin, Hash: []byte{1, 2}, CreatedAt: 10},
		{ID: "bbbbbbbbbbbb", Name: "agent", Role: ledger.RoleWriter, Hash: []byte{3}, Namespaces: []string{"a", "b"}, CreatedAt: 11},
	}
	for i := range rows {
		if err := ts.InsertToken(ctx, &rows[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := ts.InsertToken(ctx, &ledger.TokenRow{ID: "cccccccccccc", Name: "ops", Role: ledger.RoleReader, Hash: []byte{4}}); !errors.Is(err, ledger.ErrTokenExists) {
		t.Fatalf("duplicate name: got %v, want ErrTokenExists", err)
	}
	list, err := ts.ListTokens(ctx)
	if err != nil || len(list) != 2 || list[0].Name != "agent" || !slices.Equal(list[0].Namespaces, []string{"a", "b"}) ||
		list[1].Name != "ops" || list[1].Namespaces != nil {
		t.Fatalf("ListTokens = %+v, %v", list, err)
	}
	got, err := ts.LookupToken(ctx, "aaaaaaaaaaaa")
	if err != nil || got == nil || got.Name != "ops" || !slices.Equal(got.Hash, []byte{1, 2}) || got.CreatedAt != 10 {
		t.Fatalf("LookupToken = %+v, %v", got, err)
	}
	if got, err := ts.LookupToken(ctx, "zzzzzzzzzzzz"); err != nil || got != nil {
		t.Fatalf("LookupToken(unknown) = %+v, %v", got, err)
	}
	// A revocation through one store holds at once through another.
	other := mustOpen(t, u, postgres.Options{}).Tokens()
	if err := other.RevokeToken(ctx, "ops", 99); err != nil {
		t.Fatal(err)
	}
	if err := ts.RevokeToken(ctx, "ops", 100); !errors.Is(err, ledger.ErrTokenUnknown) {
		t.Fatalf("second revoke: got %v, want ErrTokenUnknown", err)
	}
	if got, _ := ts.LookupToken(ctx, "aaaaaaaaaaaa"); got.RevokedAt != 99 {
		t.Fatalf("revoked_at = %d", got.RevokedAt)
	}
	if err := ts.RevokeToken(ctx, "agent", 5); err != nil {
		t.Fatal(err)
	}
	if ok, err := ts.AnyValidToken(ctx); err != nil || ok {
		t.Fatalf("AnyValidToken with all revoked = %v, %v", ok, err)
	}
}

func TestStore_OnEnded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.URL(t)
	a, b := mustOpen(t, u, postgres.Options{}), mustOpen(t, u, postgres.Options{})
	if err := a.CreateNamespace(ctx, "other", ledger.NamespaceSettings{}); err != nil {
		t.Fatal(err)
	}
	type event struct {
		ns   string
		keys []string
	}
	own := make(chan event, 100)
	heard := make(chan event, 100)
	a.OnEnded(func(ns string, keys []string) { own <- event{ns, keys} })
	b.OnEnded(func(ns string, keys []string) { heard <- event{ns, keys} })
	pid := mustListen(t, b, "b's LISTEN connection did not come up")
	mustListen(t, a, "a's LISTEN connection did not come up")
	next := func(ch chan event, what string) event {
		t.Helper()
		select {
		case e := <-ch:
			return e
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s event", what)
			return event{}
		}
	}
	// Once it listens, a session wakes every namespace's waiters: one
	// that parked before then may have missed its key's commit.
	for _, ch := range []chan event{own, heard} {
		var woken []string
		for range 2 {
			e := next(ch, "wake-all")
			if e.keys != nil {
				t.Fatalf("wake-all event %+v has keys", e)
			}
			woken = append(woken, e.ns)
		}
		slices.Sort(woken)
		if !slices.Equal(woken, []string{ledger.DefaultNamespace, "other"}) {
			t.Fatalf("woken %v, want every namespace", woken)
		}
	}
	ca := mustChain(t, a, ledger.DefaultNamespace)
	update(t, ca, func(ctx context.Context, tx ledger.Tx) error {
		for _, k := range []string{"key-00001", "key-00002", "key-00003"} {
			if _, err := reserve(ctx, tx, call{key: k, exec: "e", tool: "t"}, 60000); err != nil {
				return err
			}
		}
		return nil
	})
	// A failed Update that appended a commit announces nothing.
	err := ca.Update(ctx, func(ctx context.Context, tx ledger.Tx) error {
		if _, err := finish(ctx, tx, "key-00003", chain.OutcomeSucceeded, ""); err != nil {
			return err
		}
		return errors.New("rolled back")
	})
	if err == nil {
		t.Fatal("Update succeeded")
	}
	update(t, ca, func(ctx context.Context, tx ledger.Tx) error {
		for _, k := range []string{"key-00001", "key-00002"} {
			if _, err := finish(ctx, tx, k, chain.OutcomeSucceeded, ""); err != nil {
				return err
			}
		}
		return nil
	})
	select { // this Store's own commit is delivered before Update returns
	case e := <-own:
		if e.ns != ledger.DefaultNamespace || !slices.Equal(e.keys, []string{"key-00001", "key-00002"}) {
			t.Fatalf("own event %+v", e)
		}
	default:
		t.Fatal("no own event when Update returned")
	}
	if e := next(heard, "NOTIFY"); e.ns != ledger.DefaultNamespace || !slices.Equal(e.keys, []string{"key-00001", "key-00002"}) {
		t.Fatalf("heard %+v, want default [key-00001 key-00002] (and nothing of the rolled-back batch)", e)
	}
	// Many ended keys are split into NOTIFY payloads under 8000 bytes.
	var many []string
	update(t, ca, func(ctx context.Context, tx ledger.Tx) error {
		for i := range 120 {
			k := fmt.Sprintf("key-%0100d", i)
			many = append(many, k)
			if _, err := reserve(ctx, tx, call{key: k, exec: "e", tool: "t"}, 60000); err != nil {
				return err
			}
			if _, err := finish(ctx, tx, k, chain.OutcomeFailed, "x"); err != nil {
				return err
			}
		}
		return nil
	})
	<-own
	var got []string
	for len(got) < len(many) {
		got = append(got, next(heard, "split NOTIFY").keys...)
	}
	if !slices.Equal(got, many) {
		t.Fatalf("heard %d keys, want the %d ended", len(got), len(many))
	}
	// After its LISTEN connection is lost, b wakes every namespace.
	psql(t, u, `SELECT pg_terminate_backend($1::int)`, int64(pid))
	var woke []string
	for len(woke) < 2 {
		e := next(heard, "wake-all")
		if e.keys != nil {
			t.Fatalf("after a reconnect: %+v, want nil keys", e)
		}
		woke = append(woke, e.ns)
	}
	if !slices.Equal(woke, []string{"default", "other"}) {
		t.Fatalf("woke %v, want every namespace", woke)
	}
	mustListen(t, b, "b did not listen again")
}

func TestStore_TrySignerLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.URL(t)
	a, b := mustOpen(t, u, postgres.Options{}), mustOpen(t, u, postgres.Options{})
	release, ok, err := a.TrySignerLock(ctx, "default")
	if err != nil || !ok {
		t.Fatalf("a: %v %v", ok, err)
	}
	if _, ok, err := b.TrySignerLock(ctx, "default"); err != nil || ok {
		t.Fatalf("b got the lock a holds: %v %v", ok, err)
	}
	relOther, ok, err := b.TrySignerLock(ctx, "other")
	if err != nil || !ok {
		t.Fatalf("b, another namespace: %v %v", ok, err)
	}
	relOther()
	release()
	release() // idempotent
	relB, ok, err := b.TrySignerLock(ctx, "default")
	if err != nil || !ok {
		t.Fatalf("b after a released: %v %v", ok, err)
	}
	relB()
	// A holder whose session ends (its process died) frees the lock.
	relA, ok, err := a.TrySignerLock(ctx, "default")
	if err != nil || !ok {
		t.Fatalf("a again: %v %v", ok, err)
	}
	defer relA()
	psql(t, u, `SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = 'ledgerd-signer'`)
	relB, ok, err = b.TrySignerLock(ctx, "default")
	if err != nil || !ok {
		t.Fatalf("b after a's session ended: %v %v", ok, err)
	}
	relB()
}

// TestStore_LiveReplicas counts the writable stores connected to the
// database: a closed one stops counting at once, a read-only one never
// counts.
func TestStore_LiveReplicas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	a := mustOpen(t, dbURL, postgres.Options{})
	b := mustOpen(t, dbURL, postgres.Options{})
	ro := mustOpen(t, dbURL, postgres.Options{ReadOnly: true})
	for _, s := range []*postgres.Store{a, b, ro} {
		s.OnEnded(func(string, []string) {})
	}
	waitFor := func(want int) {
		t.Helper()
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			n, err := ro.LiveReplicas(ctx)
			if assert.NoError(c, err) {
				assert.Equal(c, want, n, "live replicas")
			}
		}, 10*time.Second, 20*time.Millisecond)
	}
	waitFor(2)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(1)
}
