package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/postgres"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/pgtest"
)

// Receipts of SPEC §2.1's new kinds, as the gate appends them.

func policyReceipt(text string) chain.Receipt {
	return chain.Receipt{Kind: chain.KindPolicy, Result: text, Actor: "token:ops"}
}

func askReceipt(c call, ref, expires uint64) chain.Receipt {
	r := c.receipt(chain.KindAsk)
	r.RefSeq, r.LeaseExpiresAt, r.Actor = ref, expires, "token:agent"
	r.Result = `{"input_hash":"` + c.input + `","summary":"pay"}`
	return r
}

func approvalReceipt(ask chain.Receipt, outcome string) chain.Receipt {
	return chain.Receipt{Kind: chain.KindApproval, IdempotencyKey: ask.IdempotencyKey, Tool: ask.Tool,
		Effect: ask.Effect, Idempotent: ask.Idempotent, InputHash: ask.InputHash, Outcome: outcome,
		RefSeq: ask.Seq, Actor: "token:alice", Note: "ok", Result: `{"role":"approver"}`}
}

// reserveRef appends a reserve of c naming ref and writes the key record
// the domain would: a new generation (newGen) or the same one with this
// reservation.
func reserveRef(ctx context.Context, tx ledger.Tx, c call, leaseMS, ref uint64, newGen bool) (chain.Receipt, error) {
	k, found, err := tx.Key(ctx, c.key)
	if err != nil {
		return chain.Receipt{}, err
	}
	r := c.receipt(chain.KindReserve)
	r.LeaseExpiresAt, r.RefSeq = locked(tx).Now+leaseMS, ref
	l, err := appendReceipt(ctx, tx, r)
	if err != nil {
		return l, err
	}
	if !found || newGen {
		k = ledger.KeyRecord{Key: c.key, Tool: c.tool, Effect: chain.EffectWrite, InputHash: c.input, FirstSeq: l.Seq}
	}
	k.ReserveSeq, k.LeaseExpiresAt, k.TokenHash = l.Seq, r.LeaseExpiresAt, "token-"+c.exec
	return l, tx.PutKey(ctx, &k)
}

func policySeq(tb testing.TB, c ledger.Chain) uint64 {
	tb.Helper()
	var got uint64
	update(tb, c, func(ctx context.Context, tx ledger.Tx) error {
		var err error
		got, err = txPolicySeq(ctx, tx)
		return err
	})
	return got
}

func schemaVersion(tb testing.TB, dbURL string) int {
	tb.Helper()
	return queryInt(tb, dbURL, `SELECT version FROM schema_version`)
}

// queryInt is the one integer that query selects on dbURL.
func queryInt(tb testing.TB, dbURL, query string) int {
	tb.Helper()
	ctx := context.Background()
	conn := connect(tb, dbURL)
	defer func() { _ = conn.Close(ctx) }()
	var v int
	if err := conn.QueryRow(ctx, query).Scan(&v); err != nil {
		tb.Fatal(err)
	}
	return v
}

// execErr runs sql on dbURL, which must fail with an error that says want
// (any error, if want is empty).
func execErr(tb testing.TB, dbURL, want, sql string) {
	tb.Helper()
	ctx := context.Background()
	conn := connect(tb, dbURL)
	defer func() { _ = conn.Close(ctx) }()
	if _, err := conn.Exec(ctx, sql); err == nil || !strings.Contains(err.Error(), want) {
		tb.Errorf("%s: got %v, want an error saying %q", sql, err, want)
	}
}

// copyTable copies every row of table from src's database into dst's.
func copyTable(tb testing.TB, src, dst, table string) {
	tb.Helper()
	ctx := context.Background()
	from := connect(tb, src)
	defer func() { _ = from.Close(ctx) }()
	to := connect(tb, dst)
	defer func() { _ = to.Close(ctx) }()
	rows, err := from.Query(ctx, `SELECT * FROM `+table)
	if err != nil {
		tb.Fatal(err)
	}
	var cols []string
	for _, f := range rows.FieldDescriptions() {
		cols = append(cols, f.Name)
	}
	var vals [][]any
	for rows.Next() {
		v, err := rows.Values()
		if err != nil {
			tb.Fatal(err)
		}
		vals = append(vals, v)
	}
	if err := rows.Err(); err != nil {
		tb.Fatal(err)
	}
	if _, err := to.CopyFrom(ctx, pgx.Identifier{table}, cols, pgx.CopyFromRows(vals)); err != nil {
		tb.Fatalf("copy %s: %v", table, err)
	}
}

// TestOpen_migratesV2: a database that a schema 2 build created and wrote
// is read as it is by a read-only store and taken to schema 3 by a writer
// in one transaction: its chain and keys unchanged, no policy, and the new
// kinds, role and tables in place.
func TestOpen_migratesV2(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srcURL, u := pgtest.URL(t), pgtest.URL(t)
	// What a schema 2 build wrote (the kinds of v1.2), written in srcURL
	// and copied into u's schema 2 tables.
	{
		s := mustOpen(t, srcURL, postgres.Options{Logger: quiet})
		update(t, mustChain(t, s, ledger.DefaultNamespace), func(ctx context.Context, tx ledger.Tx) error {
			for i, k := range []string{"key-00001", "key-00002", "key-00003"} {
				if _, err := reserve(ctx, tx, call{key: k, exec: "e", tool: "pay", input: "sha256:aa"}, 1000); err != nil {
					return err
				}
				if i < 2 {
					if _, err := finish(ctx, tx, k, chain.OutcomeFailed, "E"); err != nil {
						return err
					}
				}
			}
			return nil
		})
		_ = s.Close()
	}
	conn := connect(t, u)
	if err := postgres.CreateSchemaV2(ctx, conn); err != nil {
		t.Fatalf("schema 2: %v", err)
	}
	_ = conn.Close(ctx)
	for _, table := range []string{"receipts", "tree_hashes", "keys", "tokens"} {
		copyTable(t, srcURL, u, table)
	}
	psql(t, u, `UPDATE head SET seq = 5, hash = (SELECT hash FROM receipts WHERE seq = 5),
		recorded_at = (SELECT recorded_at FROM receipts WHERE seq = 5)`)
	psql(t, u, `INSERT INTO tokens (token_id, name, role, token_hash, created_at) VALUES ('t1', 'ops', 'admin', '\x01', 1)`)
	execErr(t, u, "", `INSERT INTO tokens (token_id, name, role, token_hash, created_at) VALUES ('t2', 'alice', 'approver', '\x02', 1)`)

	ro := mustOpen(t, u, postgres.Options{Logger: quiet, ReadOnly: true})
	rc := mustChain(t, ro, ledger.DefaultNamespace)
	before := checkChain(t, rc)
	if len(before) != 5 || schemaVersion(t, u) != 2 {
		t.Fatalf("schema 2: %d receipts, version %d", len(before), schemaVersion(t, u))
	}
	if in, found, err := rc.AskInput(ctx, 1, 0); err != nil || found || in != "" {
		t.Fatalf("AskInput on schema 2 = %q, %v, %v; want none", in, found, err)
	}

	w := mustOpen(t, u, postgres.Options{Logger: quiet})
	if v := schemaVersion(t, u); v != postgres.SchemaVersion {
		t.Fatalf("schema version %d after migrating, want %d", v, postgres.SchemaVersion)
	}
	c := mustChain(t, w, ledger.DefaultNamespace)
	if after := checkChain(t, c); !slices.EqualFunc(before, after, func(a, b chain.Receipt) bool { return a.Hash == b.Hash }) {
		t.Fatal("the chain changed in the migration")
	}
	for _, k := range []string{"key-00001", "key-00002", "key-00003"} {
		if d, err := c.KeyDrift(ctx, k); err != nil || len(d) != 0 {
			t.Fatalf("KeyDrift(%s) after migrating = %v, %v", k, d, err)
		}
	}
	if got := policySeq(t, c); got != 0 {
		t.Fatalf("PolicySeq of a migrated namespace = %d, want 0", got)
	}
	// The gate works on the migrated database.
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		p, err := appendReceipt(ctx, tx, policyReceipt(`{"rules":[]}`))
		if err != nil {
			return err
		}
		if got, err := txPolicySeq(ctx, tx); err != nil || got != p.Seq {
			return fmt.Errorf("PolicySeq after appending %d = %d, %v", p.Seq, got, err)
		}
		var n int
		return tx.RecentOutcomes(ctx, "pay", "sha256:aa", 0, func(*chain.Receipt) bool { n++; return true })
	})
	if got := policySeq(t, c); got != 6 {
		t.Fatalf("PolicySeq = %d, want 6", got)
	}
	psql(t, u, `INSERT INTO tokens (token_id, name, role, token_hash, created_at) VALUES ('t2', 'alice', 'approver', '\x02', 1)`)
	// Reopening finds the current schema and changes nothing.
	again := mustOpen(t, u, postgres.Options{Logger: quiet})
	if got := policySeq(t, mustChain(t, again, ledger.DefaultNamespace)); got != 6 || schemaVersion(t, u) != postgres.SchemaVersion {
		t.Fatalf("after reopening: PolicySeq %d, version %d", got, schemaVersion(t, u))
	}
	// One CHECK per column, the new one.
	conn = connect(t, u)
	defer func() { _ = conn.Close(ctx) }()
	var defs []string
	rows, err := conn.Query(ctx, `SELECT pg_get_constraintdef(oid) FROM pg_constraint
		WHERE conname IN ('receipts_kind_check', 'tokens_role_check') ORDER BY conname`)
	if err != nil {
		t.Fatal(err)
	}
	if defs, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if len(defs) != 2 || !strings.Contains(defs[0], "'deny'") || !strings.Contains(defs[1], "'approver'") {
		t.Fatalf("constraints %q", defs)
	}
	// Schema 4 (contract v1.4): the four new kinds at once, and the
	// repeat guard's index counts a reconcile as an outcome.
	for _, k := range []string{"'key'", "'erase'", "'reconcile'", "'prune'"} {
		if !strings.Contains(defs[0], k) {
			t.Fatalf("receipts_kind_check %q lacks %s", defs[0], k)
		}
	}
	var idx string
	if err := conn.QueryRow(ctx, `SELECT indexdef FROM pg_indexes WHERE indexname = 'receipts_outcomes_by_input'`).Scan(&idx); err != nil ||
		!strings.Contains(idx, "'reconcile'") {
		t.Fatalf("receipts_outcomes_by_input = %q, %v", idx, err)
	}
}

// TestSchema_newKinds: the receipts of the new kinds, with their field
// use (a policy receipt has no key, no execution and attempt 0), are
// stored and read back; other kinds and roles are still refused.
func TestSchema_newKinds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.URL(t)
	_, c := mustOpenDefault(t, u, postgres.Options{Logger: quiet})
	pay := call{key: "key-00001", exec: "e1", tool: "payments.charge", input: "sha256:aa"}
	var want []chain.Receipt
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		p, err := appendReceipt(ctx, tx, policyReceipt(`{"rules":[{"tool":"payments.*","approval":"required"}]}`))
		if err != nil {
			return err
		}
		a, err := appendReceipt(ctx, tx, askReceipt(pay, 0, locked(tx).Now+3_600_000))
		if err != nil {
			return err
		}
		ap, err := appendReceipt(ctx, tx, approvalReceipt(a, chain.OutcomeApproved))
		if err != nil {
			return err
		}
		d := call{key: "key-00002", exec: "e2", tool: "shell.rm", input: "sha256:bb"}.receipt(chain.KindDeny)
		dn, err := appendReceipt(ctx, tx, d)
		if err != nil {
			return err
		}
		r, err := reserveRef(ctx, tx, pay, 1000, ap.Seq, true)
		want = []chain.Receipt{p, a, ap, dn, r}
		return err
	})
	got := checkChain(t, c)
	if len(got) != len(want) {
		t.Fatalf("%d receipts, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i].Hash != want[i].Hash || got[i].Kind != want[i].Kind {
			t.Fatalf("receipt %d = %+v, want %+v", i+1, got[i], want[i])
		}
	}
	if got[0].IdempotencyKey != "" || got[0].Attempt != 0 || got[2].Outcome != chain.OutcomeApproved {
		t.Fatalf("policy %+v, approval %+v", got[0], got[2])
	}
	// Only the reserve made a key; the deny made none.
	var keys []string
	if err := c.Keys(ctx, func(k *ledger.KeyRecord) error { keys = append(keys, k.Key); return nil }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(keys, []string{"key-00001"}) {
		t.Fatalf("keys %v, want [key-00001]", keys)
	}
	if d, err := c.KeyDrift(ctx, "key-00001"); err != nil || len(d) != 0 {
		t.Fatalf("KeyDrift = %v, %v", d, err)
	}
	conn := connect(t, u)
	defer func() { _ = conn.Close(ctx) }()
	// A kind the schema does not know is still refused (the insert fails
	// before the head moves, so the chain stays whole).
	_, err := conn.Exec(ctx, `INSERT INTO receipts SELECT namespace, 99, 'approve', idempotency_key, key_generated,
		execution_id, attempt, tool, effect, idempotent, input_hash, outcome, external_ref, result, error_code,
		error_message, retryable, lease_expires_at, ref_seq, actor, note, recorded_at, prev_hash, hash
		FROM receipts WHERE seq = 1`)
	if err == nil {
		t.Fatal("kind 'approve' accepted")
	}
	if _, err := conn.Exec(ctx, `INSERT INTO tokens (token_id, name, role, token_hash, created_at) VALUES ('x', 'x', 'root', '\x00', 1)`); err == nil {
		t.Fatal("role 'root' accepted")
	}
}

// TestTx_PolicySeq: the head row carries the latest policy receipt's seq,
// read with the lock at BEGIN and moved by the compare-and-set; a
// transaction sees its own policy appends; a rolled-back one leaves it;
// each namespace has its own; and the head refuses a policy_seq that does
// not name the latest policy receipt.
func TestTx_PolicySeq(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.URL(t)
	s, c := openWithOther(t, u)
	if got := policySeq(t, c); got != 0 {
		t.Fatalf("PolicySeq of a new namespace = %d", got)
	}
	step := func(tx ledger.Tx, r chain.Receipt, want uint64) error {
		if _, err := appendReceipt(ctx, tx, r); err != nil {
			return err
		}
		if got, err := txPolicySeq(ctx, tx); err != nil || got != want {
			return fmt.Errorf("PolicySeq after appending %s = %d, %v; want %d", r.Kind, got, err, want)
		}
		return nil
	}
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		if err := step(tx, call{key: "key-00001", exec: "e", tool: "t"}.receipt(chain.KindReserve), 0); err != nil {
			return err
		}
		if err := step(tx, policyReceipt(`{"rules":[]}`), 2); err != nil {
			return err
		}
		if err := step(tx, call{key: "key-00002", exec: "e", tool: "t"}.receipt(chain.KindDeny), 2); err != nil {
			return err
		}
		return step(tx, policyReceipt(`{"rules":[{"tool":"*","deny":true}]}`), 4)
	})
	if got := policySeq(t, c); got != 4 {
		t.Fatalf("PolicySeq in the next transaction = %d, want 4", got)
	}
	// A second store (another replica) reads it from the head row.
	if got := policySeq(t, mustChain(t, mustOpen(t, u, postgres.Options{Logger: quiet}), ledger.DefaultNamespace)); got != 4 {
		t.Fatalf("PolicySeq through another store = %d, want 4", got)
	}
	err := c.Update(ctx, func(ctx context.Context, tx ledger.Tx) error {
		if err := step(tx, policyReceipt(`{}`), 5); err != nil {
			return err
		}
		return errors.New("rolled back")
	})
	if err == nil || err.Error() != "rolled back" {
		t.Fatalf("Update = %v", err)
	}
	if got := policySeq(t, c); got != 4 {
		t.Fatalf("PolicySeq after a rollback = %d, want 4", got)
	}
	if got := policySeq(t, mustChain(t, s, "other")); got != 0 {
		t.Fatalf("PolicySeq of another namespace = %d, want 0", got)
	}
	// The head refuses a policy_seq that moves back or names anything but
	// a policy receipt, and a policy receipt it does not name.
	execErr(t, u, "must name a stored policy receipt", `UPDATE head SET policy_seq = 2 WHERE namespace = 'default'`)
	execErr(t, u, "must name a stored policy receipt", `UPDATE head SET policy_seq = 5 WHERE namespace = 'default'`)
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		_, err := appendReceipt(ctx, tx, call{key: "key-00003", exec: "e", tool: "t"}.receipt(chain.KindReserve))
		return err
	})
	execErr(t, u, "must name a stored policy receipt", `UPDATE head SET policy_seq = 5 WHERE namespace = 'default'`)
	execErr(t, u, "latest policy receipt", `INSERT INTO receipts SELECT namespace, 6, kind, idempotency_key, key_generated,
		execution_id, attempt, tool, effect, idempotent, input_hash, outcome, external_ref, result, error_code,
		error_message, retryable, lease_expires_at, ref_seq, actor, note, recorded_at, prev_hash, hash
		FROM receipts WHERE namespace = 'default' AND seq = 4;
		UPDATE head SET seq = 6, hash = (SELECT hash FROM receipts WHERE namespace = 'default' AND seq = 4)
		WHERE namespace = 'default'`)
	if got := policySeq(t, c); got != 4 {
		t.Fatalf("PolicySeq = %d, want 4", got)
	}
	checkChain(t, c)
}

// TestTx_KeyHistory: a key's receipts of every kind from a seq on, the
// stored ones (one query) followed by this transaction's appends.
func TestTx_KeyHistory(t *testing.T) {
	t.Parallel()
	u := pgtest.URL(t)
	_, c := mustOpenDefault(t, u, postgres.Options{Logger: quiet})
	pay := call{key: "key-00001", exec: "e1", tool: "pay", input: "sha256:aa"}
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		if _, err := appendReceipt(ctx, tx, policyReceipt(`{}`)); err != nil { // 1
			return err
		}
		a, err := appendReceipt(ctx, tx, askReceipt(pay, 0, locked(tx).Now+1000)) // 2
		if err != nil {
			return err
		}
		if _, err := reserve(ctx, tx, call{key: "key-00002", exec: "e2", tool: "pay"}, 1000); err != nil { // 3
			return err
		}
		_, err = appendReceipt(ctx, tx, approvalReceipt(a, chain.OutcomeApproved)) // 4
		return err
	})
	seqsOf := func(rs []chain.Receipt) []uint64 { return seqs(rs) }
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		r, err := reserveRef(ctx, tx, pay, 1000, 4, true) // 5, buffered
		if err != nil {
			return err
		}
		if _, err := reserve(ctx, tx, call{key: "key-00003", exec: "e3", tool: "pay"}, 1000); err != nil { // 6
			return err
		}
		for _, tc := range []struct {
			key   string
			since uint64
			want  []uint64
		}{
			{"key-00001", 0, []uint64{2, 4, 5}},
			{"key-00001", 3, []uint64{4, 5}},
			{"key-00001", 5, []uint64{5}},
			{"key-00001", 6, nil},
			{"key-00002", 0, []uint64{3}},
			{"key-00003", 1, []uint64{6}},
			{"key-99999", 0, nil},
		} {
			got, err := tx.KeyHistory(ctx, tc.key, tc.since)
			if err != nil {
				return err
			}
			if !slices.Equal(seqsOf(got), tc.want) {
				return fmt.Errorf("KeyHistory(%s, %d) = %v, want %v", tc.key, tc.since, seqsOf(got), tc.want)
			}
			for i := range got {
				if got[i].Seq == r.Seq && got[i].Hash != r.Hash || got[i].Seq == 4 && got[i].Kind != chain.KindApproval {
					return fmt.Errorf("KeyHistory: receipt %d is %+v", got[i].Seq, got[i])
				}
			}
		}
		return nil
	})
}

// TestTx_RecentOutcomes: the commits and resolves of one (tool,
// input_hash) recorded since a time, in seq order, stored then buffered,
// until fn says stop; fn may use the transaction.
func TestTx_RecentOutcomes(t *testing.T) {
	t.Parallel()
	clock := testkit.NewClock()
	u := pgtest.URL(t)
	_, c := mustOpenDefault(t, u, postgres.Options{Logger: quiet, Now: clock.Now})
	run := func(cl call, outcome string) {
		t.Helper()
		update(t, c, func(ctx context.Context, tx ledger.Tx) error {
			if _, err := reserve(ctx, tx, cl, 1000); err != nil {
				return err
			}
			_, err := finish(ctx, tx, cl.key, outcome, "E")
			return err
		})
		clock.Advance(100 * time.Millisecond)
	}
	// At t0: seq 1, 2 (failed); t0+100: 3, 4 (other input); t0+200: 5, 6
	// (other tool); t0+300: 7, 8 (succeeded); t0+400: 9, 10 (not_applied).
	run(call{key: "key-00001", exec: "e1", tool: "pay", input: "sha256:aa"}, chain.OutcomeFailed)
	run(call{key: "key-00002", exec: "e2", tool: "pay", input: "sha256:bb"}, chain.OutcomeFailed)
	run(call{key: "key-00003", exec: "e3", tool: "mail", input: "sha256:aa"}, chain.OutcomeFailed)
	run(call{key: "key-00004", exec: "e4", tool: "pay", input: "sha256:aa"}, chain.OutcomeSucceeded)
	run(call{key: "key-00005", exec: "e5", tool: "pay", input: "sha256:aa"}, chain.OutcomeNotApplied)
	t0 := uint64(testkit.T0)
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		cl := call{key: "key-00006", exec: "e6", tool: "pay", input: "sha256:aa"}
		if _, err := reserve(ctx, tx, cl, 1000); err != nil { // 11
			return err
		}
		if _, err := finish(ctx, tx, cl.key, chain.OutcomeFailed, "E"); err != nil { // 12, buffered
			return err
		}
		collect := func(tool, input string, notBefore uint64, stopAfter int) ([]uint64, error) {
			var got []uint64
			err := tx.RecentOutcomes(ctx, tool, input, notBefore, func(r *chain.Receipt) bool {
				// fn may read through the transaction
				if _, err := tx.Receipt(ctx, r.RefSeq); err != nil {
					t.Errorf("Receipt(%d) inside fn: %v", r.RefSeq, err)
				}
				got = append(got, r.Seq)
				return len(got) < stopAfter
			})
			return got, err
		}
		for _, tc := range []struct {
			tool, input string
			notBefore   uint64
			stopAfter   int
			want        []uint64
		}{
			{"pay", "sha256:aa", 0, 99, []uint64{2, 8, 10, 12}},
			{"pay", "sha256:aa", t0 + 1, 99, []uint64{8, 10, 12}},
			{"pay", "sha256:aa", t0 + 400, 99, []uint64{10, 12}},
			{"pay", "sha256:aa", t0 + 500, 99, []uint64{12}},
			{"pay", "sha256:aa", t0 + 501, 99, nil},
			{"pay", "sha256:aa", 0, 1, []uint64{2}},
			{"pay", "sha256:aa", t0 + 400, 2, []uint64{10, 12}},
			{"pay", "sha256:bb", 0, 99, []uint64{4}},
			{"mail", "sha256:aa", 0, 99, []uint64{6}},
			{"pay", "", 0, 99, nil},
		} {
			got, err := collect(tc.tool, tc.input, tc.notBefore, tc.stopAfter)
			if err != nil {
				return err
			}
			if !slices.Equal(got, tc.want) {
				return fmt.Errorf("RecentOutcomes(%s, %s, +%d, stop after %d) = %v, want %v",
					tc.tool, tc.input, int64(tc.notBefore)-int64(t0), tc.stopAfter, got, tc.want)
			}
		}
		return nil
	})
	// The resolves of an interrupted reserve count too.
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		cl := call{key: "key-00007", exec: "e7", tool: "pay", input: "sha256:cc"}
		r, err := reserve(ctx, tx, cl, 1)
		if err != nil {
			return err
		}
		res := cl.receipt(chain.KindResolve)
		res.RefSeq, res.Outcome, res.Note = r.Seq, chain.OutcomeFailed, "gone"
		_, err = appendReceipt(ctx, tx, res)
		return err
	})
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		var got []string
		err := tx.RecentOutcomes(ctx, "pay", "sha256:cc", 0, func(r *chain.Receipt) bool {
			got = append(got, r.Kind)
			return true
		})
		if err != nil || !slices.Equal(got, []string{chain.KindResolve}) {
			return fmt.Errorf("RecentOutcomes of a resolve = %v, %v", got, err)
		}
		return nil
	})
}

// openWithOther opens a Store on dbURL with a namespace "other" beside the
// default one, and returns it with the default namespace's chain.
func openWithOther(t *testing.T, dbURL string) (*postgres.Store, *postgres.Chain) {
	t.Helper()
	s := mustOpen(t, dbURL, postgres.Options{Logger: quiet})
	if err := s.CreateNamespace(context.Background(), "other", ledger.NamespaceSettings{}); err != nil {
		t.Fatal(err)
	}
	return s, mustChain(t, s, ledger.DefaultNamespace)
}

// askInputRows counts the kept inputs of the database.
func askInputRows(tb testing.TB, dbURL string) int {
	tb.Helper()
	return queryInt(tb, dbURL, `SELECT count(*) FROM approval_inputs`)
}

// TestTx_AskInputs: an ask's input is kept, off the chain, in the
// transaction of the ask, until its delete_after; an answer moves that;
// each write deletes the inputs past theirs; AskInput hides an input past
// its delete_after; a rolled-back or retried Update writes nothing twice.
func TestTx_AskInputs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.URL(t)
	s, c := openWithOther(t, u)
	const day = 86_400_000
	var t0 uint64
	input := `{"amount":1200,"currency":"eur","memo":"café \u2028"}`
	ask := func(ctx context.Context, tx ledger.Tx, key, in string, deleteAfter uint64) (chain.Receipt, error) {
		a, err := appendReceipt(ctx, tx, askReceipt(call{key: key, exec: "e", tool: "pay", input: "sha256:aa"}, 0, locked(tx).Now+1000))
		if err != nil {
			return a, err
		}
		return a, tx.PutAskInput(ctx, a.Seq, in, deleteAfter, locked(tx).Now)
	}
	injectOnce(t, u, "40001") // the first run fails at write time and runs again
	var runs int
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		runs++
		t0 = locked(tx).Now
		if _, err := ask(ctx, tx, "key-00001", input, t0+day); err != nil { // 1
			return err
		}
		if _, err := ask(ctx, tx, "key-00002", `{"n":2}`, t0+2*day); err != nil { // 2
			return err
		}
		// The upsert keeps the last input and deadline of a seq.
		return tx.PutAskInput(ctx, 2, `{"n":2}`, t0+3*day, t0)
	})
	if runs != 2 || askInputRows(t, u) != 2 {
		t.Fatalf("%d runs, %d rows; want 2 and 2", runs, askInputRows(t, u))
	}
	for _, tc := range []struct {
		seq, now uint64
		want     string
		found    bool
	}{
		{1, t0, input, true},
		{1, t0 + day, input, true},
		{1, t0 + day + 1, "", false},
		{2, t0 + 3*day, `{"n":2}`, true},
		{2, t0 + 3*day + 1, "", false},
		{3, t0, "", false},
	} {
		got, found, err := c.AskInput(ctx, tc.seq, tc.now)
		if err != nil || found != tc.found || got != tc.want {
			t.Errorf("AskInput(%d, +%d) = %q, %v, %v; want %q, %v", tc.seq, tc.now-t0, got, found, err, tc.want, tc.found)
		}
	}
	if _, found, err := mustChain(t, s, "other").AskInput(ctx, 1, t0); err != nil || found {
		t.Fatalf("AskInput of another namespace = %v, %v", found, err)
	}
	// The answer to ask 1 moves its deadline; a deadline for an input no
	// longer kept changes nothing.
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		a, err := tx.Receipt(ctx, 1)
		if err != nil {
			return err
		}
		if _, err := appendReceipt(ctx, tx, approvalReceipt(a, chain.OutcomeRejected)); err != nil {
			return err
		}
		if err := tx.SetAskInputDeadline(ctx, 1, t0+5*day, t0); err != nil {
			return err
		}
		return tx.SetAskInputDeadline(ctx, 77, t0+5*day, t0)
	})
	if _, found, _ := c.AskInput(ctx, 1, t0+5*day); !found || askInputRows(t, u) != 2 {
		t.Fatalf("after the answer: found %v, %d rows", found, askInputRows(t, u))
	}
	// A rolled-back Update keeps nothing.
	err := c.Update(ctx, func(ctx context.Context, tx ledger.Tx) error {
		if _, err := ask(ctx, tx, "key-00003", `{}`, t0+day); err != nil {
			return err
		}
		return errors.New("rolled back")
	})
	if err == nil || askInputRows(t, u) != 2 {
		t.Fatalf("rolled back: %v, %d rows", err, askInputRows(t, u))
	}
	// The next ask, at a time past input 2's deadline, deletes it.
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		a, err := appendReceipt(ctx, tx, askReceipt(call{key: "key-00004", exec: "e", tool: "pay"}, 0, locked(tx).Now+1000))
		if err != nil {
			return err
		}
		return tx.PutAskInput(ctx, a.Seq, `{"n":4}`, t0+10*day, t0+4*day)
	})
	if _, found, _ := c.AskInput(ctx, 2, 0); found || askInputRows(t, u) != 2 {
		t.Fatalf("after the purge: input 2 found %v, %d rows; want gone, 2 rows", found, askInputRows(t, u))
	}
	// An answer past every deadline but its own deletes the rest.
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		return tx.SetAskInputDeadline(ctx, 4, t0+20*day, t0+11*day)
	})
	if in, found, _ := c.AskInput(ctx, 4, t0+11*day); !found || in != `{"n":4}` || askInputRows(t, u) != 1 {
		t.Fatalf("after the answer's purge: %q %v, %d rows; want input 4 alone", in, found, askInputRows(t, u))
	}
	// What PostgreSQL text cannot hold, or more than 64 KiB, is refused
	// at once, as invalid_request, before anything is written.
	for _, bad := range []string{"{\"a\":\"\x00\"}", "\xff", `"` + strings.Repeat("x", ledger.MaxAskInput) + `"`} {
		err := c.Update(ctx, func(ctx context.Context, tx ledger.Tx) error {
			return tx.PutAskInput(ctx, 4, bad, t0+day, t0)
		})
		if ledger.ErrorCode(err) != ledger.ECodeInvalidRequest {
			t.Errorf("PutAskInput(%.20q…) = %v, want invalid_request", bad, err)
		}
	}
	checkChain(t, c)
}

// TestStore_OnEndedApproval: an approval wakes the reserves waiting on
// its key, as an outcome does; an ask, a deny and a policy do not.
func TestStore_OnEndedApproval(t *testing.T) {
	t.Parallel()
	u := pgtest.URL(t)
	a, b := mustOpen(t, u, postgres.Options{Logger: quiet}), mustOpen(t, u, postgres.Options{Logger: quiet})
	own, heard := make(chan []string, 100), make(chan []string, 100)
	a.OnEnded(func(ns string, keys []string) {
		if keys != nil {
			own <- keys
		}
	})
	b.OnEnded(func(ns string, keys []string) {
		if keys != nil {
			heard <- keys
		}
	})
	mustListen(t, b, "b's LISTEN connection did not come up")
	c := mustChain(t, a, ledger.DefaultNamespace)
	pay := call{key: "key-00001", exec: "e", tool: "pay", input: "sha256:aa"}
	var ask chain.Receipt
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		if _, err := appendReceipt(ctx, tx, policyReceipt(`{}`)); err != nil {
			return err
		}
		if _, err := appendReceipt(ctx, tx, call{key: "key-00002", exec: "e", tool: "rm"}.receipt(chain.KindDeny)); err != nil {
			return err
		}
		var err error
		ask, err = appendReceipt(ctx, tx, askReceipt(pay, 0, locked(tx).Now+1000))
		return err
	})
	select {
	case keys := <-own:
		t.Fatalf("a policy, a deny and an ask announced %v", keys)
	default:
	}
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		_, err := appendReceipt(ctx, tx, approvalReceipt(ask, chain.OutcomeApproved))
		return err
	})
	select {
	case keys := <-own:
		if !slices.Equal(keys, []string{"key-00001"}) {
			t.Fatalf("own event %v, want [key-00001]", keys)
		}
	default:
		t.Fatal("no own event for an approval when Update returned")
	}
	select {
	case keys := <-heard:
		if !slices.Equal(keys, []string{"key-00001"}) {
			t.Fatalf("heard %v, want [key-00001]", keys)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no NOTIFY for an approval")
	}
}

// TestChain_KeyDriftApprovals: the derived key rows follow a reserve that
// consumes an approval to what its ask references (SPEC §13): a renewal
// after the key's lifetime starts a generation, a takeover does not, and
// the key's first reserve starts the first; ask and approval receipts
// change no row.
func TestChain_KeyDriftApprovals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := testkit.NewClock()
	u := pgtest.URL(t)
	s := mustOpen(t, u, postgres.Options{Logger: quiet, Now: clock.Now})
	const ttl = 1000
	if err := s.CreateNamespace(ctx, "ttl", ledger.NamespaceSettings{KeyTTL: ttl}); err != nil {
		t.Fatal(err)
	}
	c := mustChain(t, s, "ttl")
	renew := call{key: "key-renew", exec: "e1", tool: "pay", input: "sha256:aa"}
	take := call{key: "key-take", exec: "e2", tool: "pay", input: "sha256:bb"}
	first := call{key: "key-first", exec: "e3", tool: "pay", input: "sha256:cc"}
	consume := func(ctx context.Context, tx ledger.Tx, cl call, ref uint64, newGen bool) error {
		a, err := appendReceipt(ctx, tx, askReceipt(cl, ref, locked(tx).Now+60_000))
		if err != nil {
			return err
		}
		ap, err := appendReceipt(ctx, tx, approvalReceipt(a, chain.OutcomeApproved))
		if err != nil {
			return err
		}
		_, err = reserveRef(ctx, tx, cl, 10, ap.Seq, newGen)
		return err
	}
	var renewOutcome, takeReserve uint64
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		if _, err := reserve(ctx, tx, renew, 1000); err != nil {
			return err
		}
		f, err := finish(ctx, tx, renew.key, chain.OutcomeSucceeded, "")
		renewOutcome = f.Seq
		if err != nil {
			return err
		}
		r, err := reserve(ctx, tx, take, 10)
		takeReserve = r.Seq
		return err
	})
	clock.Advance(2 * ttl * time.Millisecond) // key-renew's outcome is past the key's lifetime; key-take's lease has ended
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		if err := consume(ctx, tx, renew, renewOutcome, true); err != nil {
			return err
		}
		take.exec = "e4"
		if err := consume(ctx, tx, take, takeReserve, false); err != nil {
			return err
		}
		return consume(ctx, tx, first, 0, true)
	})
	for _, k := range []string{renew.key, take.key, first.key} {
		if d, err := c.KeyDrift(ctx, k); err != nil || len(d) != 0 {
			t.Errorf("KeyDrift(%s) = %q, %v; want none", k, d, err)
		}
	}
	// A row that missed the renewal drifts.
	psql(t, u, `ALTER TABLE keys DISABLE TRIGGER USER`)
	psql(t, u, `UPDATE keys SET first_seq = 1, final_seq = 2 WHERE idempotency_key = 'key-renew'`)
	if d, err := c.KeyDrift(ctx, renew.key); err != nil || len(d) != 2 {
		t.Fatalf("KeyDrift after an edit = %q, %v; want stored and derived", d, err)
	}
}

// TestStore_TokensApprover: the approver role round-trips.
func TestStore_TokensApprover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ts := mustOpen(t, pgtest.URL(t), postgres.Options{Logger: quiet}).Tokens()
	row := ledger.TokenRow{ID: "aaaaaaaaaaaa", Name: "alice", Role: ledger.RoleApprover, Hash: []byte{1}, Namespaces: []string{"pay"}, CreatedAt: 10}
	if err := ts.InsertToken(ctx, &row); err != nil {
		t.Fatal(err)
	}
	got, err := ts.LookupToken(ctx, row.ID)
	if err != nil || got == nil || got.Role != ledger.RoleApprover || !slices.Equal(got.Namespaces, []string{"pay"}) {
		t.Fatalf("LookupToken = %+v, %v", got, err)
	}
	list, err := ts.ListTokens(ctx)
	if err != nil || len(list) != 1 || list[0].Role != ledger.RoleApprover {
		t.Fatalf("ListTokens = %+v, %v", list, err)
	}
	// Through the domain as well.
	tok := ledger.NewTokens(ts)
	if _, err := tok.Create(ctx, "bob", ledger.RoleApprover); err != nil {
		t.Fatal(err)
	}
}
