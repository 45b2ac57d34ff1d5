package verify_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
	"github.com/effect-ledger/effect-ledger/verify"
)

// buildCommitted writes a committed default namespace (SPEC §14): seq 1–2
// a success with a reference and a result, 3–4 a failure with a message,
// 5–6 a success with a result, 7 the erase of the third key (seq 6's
// values).
func buildCommitted(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ledger.db")
	db := ledgertest.Open(t, ledgertest.WithPath(path), ledgertest.WithStore(sqlite.Options{Payloads: ledger.PayloadsCommitted}))
	srv := httptest.NewServer(api.NewServer(db.Ledger, api.Config{Logger: quiet}))
	defer func() { srv.Close(); require.NoError(t, db.Close()) }()
	r := post(t, srv, "/v1/effects/reserve", `{"idempotency_key":"pay-key-0001","execution_id":"e1","tool":"payments.refund","effect":"write","input":{"order":7}}`, 201)
	post(t, srv, "/v1/effects/pay-key-0001/commit", `{"reservation":"`+r["reservation"].(string)+`","outcome":"succeeded","external_ref":"re_1","result":{"to":"Jane"}}`, 201)
	r = post(t, srv, "/v1/effects/reserve", `{"idempotency_key":"mail-key-001","execution_id":"e2","tool":"email.send","effect":"external","input":{"to":"a@b.c"}}`, 201)
	post(t, srv, "/v1/effects/mail-key-001/commit", `{"reservation":"`+r["reservation"].(string)+`","outcome":"failed","error":{"code":"BOUNCED","message":"no mailbox a@b.c"}}`, 201)
	r = post(t, srv, "/v1/effects/reserve", `{"idempotency_key":"pay-key-0003","execution_id":"e3","tool":"payments.refund","effect":"write","input":{"order":9}}`, 201)
	post(t, srv, "/v1/effects/pay-key-0003/commit", `{"reservation":"`+r["reservation"].(string)+`","outcome":"succeeded","result":{"to":"John"}}`, 201)
	post(t, srv, "/v1/erasures", `{"keys":["pay-key-0003"],"reason":"request 17"}`, 201)
	return path
}

// rid is the row of the default namespace's receipt at seq, for the
// tables keyed by it.
func rid(seq string) string {
	return "(SELECT rowid FROM ns_receipts WHERE ns = 0 AND seq = " + seq + ")"
}

// TestVerifier_payloadTamper: each rule of SPEC §14 caught on a tampered
// copy of a committed ledger, offline (the file and its payload table) and,
// where the server can show it, online.
func TestVerifier_payloadTamper(t *testing.T) {
	base := buildCommitted(t)
	unguard := []string{`DROP TRIGGER ns_payloads_erase_only`, `DROP TRIGGER ns_erasures_fixed`}
	cases := []struct {
		desc    string
		steps   []string
		rehash  uint64
		want    []string
		offline bool // the server refuses to serve the tampered value (integrity_error) or cannot show it
	}{
		{"intact", nil, 0, nil, false},
		{"a value edited", []string{`UPDATE ns_payloads SET result = '{"to":"Joe"}' WHERE rid = ` + rid("2")}, 0,
			[]string{verify.RulePayloadMismatch}, true},
		{"a value deleted without a mark", []string{`UPDATE ns_payloads SET error_message = NULL, error_message_salt = NULL WHERE rid = ` + rid("4")}, 0,
			[]string{verify.RulePayloadMissing}, false},
		{"a mark naming an erase that does not list it", []string{`UPDATE ns_payloads SET error_message = NULL, error_message_salt = NULL, error_message_erased = 7 WHERE rid = ` + rid("4")}, 0,
			[]string{verify.RulePayloadMissing}, true}, // a server shows the mark, not the erasure's ranges
		{"a value put back after its erasure", []string{`UPDATE ns_payloads SET result = '{"to":"John"}', result_salt = randomblob(16), result_erased = 0 WHERE rid = ` + rid("6")}, 0,
			[]string{verify.RuleEraseIncomplete, verify.RulePayloadMismatch}, true},
		{"a commitment replaced by its value, the chain rehashed", []string{`UPDATE receipts SET external_ref = 're_1' WHERE seq = 2`}, 2,
			[]string{verify.RulePayloadUncommitted, verify.RulePayloadUnexpected}, true},
		{"a value kept for a field the chain has empty", []string{`UPDATE ns_payloads SET note = 'x', note_salt = randomblob(16) WHERE rid = ` + rid("2")}, 0,
			[]string{verify.RulePayloadUnexpected}, true},
		{"an erasure's ranges edited", []string{`UPDATE ns_erasures SET ranges = '[[5,6]]' WHERE seq = 7`}, 0,
			[]string{verify.RuleEraseInvalid}, true},
		{"an erasure's ranges unreadable", []string{`UPDATE ns_erasures SET ranges = 'x' WHERE seq = 7`}, 0,
			[]string{verify.RuleEraseInvalid}, true},
		{"an erase of a field that is not a payload field, rehashed", []string{`UPDATE receipts SET result = '{"count":1,"fields":["tool"],"set":"sha256:` +
			"0000000000000000000000000000000000000000000000000000000000000000" + `"}' WHERE seq = 7`}, 7,
			[]string{verify.RuleEraseInvalid}, true},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			path := tamperedCopy(t, base, unguard, tc.steps, tc.rehash)
			rd, err := sqlite.OpenReader(context.Background(), path, sqlite.Options{})
			require.NoError(t, err)
			defer rd.Close()
			rep, err := verify.New(rd, verify.Opts{}).Check(context.Background())
			require.NoError(t, err)
			assert.ElementsMatch(t, tc.want, rules(rep), "%+v", rep.Violations)
			for _, v := range rep.Violations {
				assert.NotContains(t, v.Detail, "Jane", "a detail never quotes a value")
			}
			if tc.offline {
				return
			}
			db := openForServing(t, path)
			srv := httptest.NewServer(api.NewServer(db.Ledger, api.Config{Logger: quiet}))
			defer func() { srv.Close(); _ = db.Close() }()
			rep, err = verify.NewRemote(server(t, srv.URL), verify.Opts{}).Check(context.Background())
			require.NoError(t, err)
			assert.ElementsMatch(t, tc.want, rules(rep), "online: %+v", rep.Violations)
		})
	}
}

// tamperedCopy is a copy of the ledger at base with the SQL steps applied
// after the unguard statements and, when rehash is not 0, the chain
// recomputed from that seq, as a forger would (tamper); with no steps, an
// intact copy.
func tamperedCopy(t *testing.T, base string, unguard, steps []string, rehash uint64) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tampered.db")
	testkit.CopyFile(t, base, path)
	if len(steps) == 0 {
		return path
	}
	all := append(stepsOf(unguard), stepsOf(steps)...)
	if rehash > 0 {
		all = append(all, stepsOf([]string{""})...)
		all[len(all)-1].RehashFrom = rehash
	}
	tamper(t, path, tamperCase{Steps: all})
	return path
}

func stepsOf(sqls []string) []struct {
	SQL        string `json:"sql"`
	RehashFrom uint64 `json:"rehash_from"`
} {
	out := make([]struct {
		SQL        string `json:"sql"`
		RehashFrom uint64 `json:"rehash_from"`
	}, len(sqls))
	for i, q := range sqls {
		out[i].SQL = q
	}
	return out
}

// TestVerifier_payloadsAbsent: a committed namespace read without its
// payload table (a copy of the receipts alone) fails with payloads_absent,
// and with ReceiptsOnly its chain alone is checked and the payloads
// reported unchecked; a changed receipt is still caught.
func TestVerifier_payloadsAbsent(t *testing.T) {
	for _, tc := range []struct {
		desc         string
		steps        []string
		receiptsOnly bool
		want         []string
	}{
		{"payload table dropped", nil, false, []string{verify.RulePayloadsAbsent}},
		{"receipts only", nil, true, nil},
		{"receipts only, a receipt changed", []string{`UPDATE ns_receipts SET actor = 'forged' WHERE ns = 0 AND seq = 2`}, true,
			[]string{verify.RuleHashMismatch}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			path := buildCommitted(t)
			tamper(t, path, tamperCase{Steps: stepsOf(append([]string{`DROP TABLE ns_payloads`, `DROP TABLE ns_erasures`}, tc.steps...))})
			rd, err := sqlite.OpenReader(context.Background(), path, sqlite.Options{})
			require.NoError(t, err)
			defer rd.Close()
			rep, err := verify.New(rd, verify.Opts{ReceiptsOnly: tc.receiptsOnly}).Check(context.Background())
			require.NoError(t, err)
			assert.ElementsMatch(t, tc.want, rules(rep), "%+v", rep.Violations)
			assert.True(t, rep.PayloadsUnchecked)
		})
	}
}

// TestVerifier_retentionErase: a retention sweep's erase must keep to the
// retention in force at its seq (SPEC §14): one that lists a receipt
// younger than payloads_ms, or that no retention allowed, is
// erase_invalid.
func TestVerifier_retentionErase(t *testing.T) {
	build := func(t *testing.T) string {
		path := filepath.Join(t.TempDir(), "ledger.db")
		db := ledgertest.Open(t, ledgertest.WithPath(path), ledgertest.WithStore(sqlite.Options{Payloads: ledger.PayloadsCommitted}))
		ctx := context.Background()
		_, err := db.SetPolicy(ctx, json.RawMessage(`{"retention":{"payloads_ms":60000}}`), "admin") // seq 1
		require.NoError(t, err)
		res := testkit.MustReserve(t, db, testkit.ReserveReq("pay-key-0001", "exec-1")) // 2
		testkit.MustCommit(t, db, testkit.Succeed("pay-key-0001", res.Reservation))     // 3
		db.Clock.Advance(61 * time.Second)
		swept, err := db.Sweep(ctx) // 4
		require.NoError(t, err)
		require.NotNil(t, swept)
		require.Equal(t, uint64(4), swept.Receipt.Seq)
		require.NoError(t, db.Close())
		return path
	}
	for _, tc := range []struct {
		desc  string
		steps []string
		want  []string
	}{
		{"intact", nil, nil},
		{"a longer retention in force", []string{`UPDATE ns_receipts SET result = replace(result, '60000', '3600000') WHERE ns = 0 AND seq = 1`},
			[]string{verify.RuleEraseInvalid}},
		{"no retention in force", []string{`UPDATE ns_receipts SET result = '{}' WHERE ns = 0 AND seq = 1`},
			[]string{verify.RuleEraseInvalid}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			path := build(t)
			if tc.steps != nil {
				steps := stepsOf(tc.steps)
				steps[len(steps)-1].RehashFrom = 1
				tamper(t, path, tamperCase{Steps: steps})
			}
			rd, err := sqlite.OpenReader(context.Background(), path, sqlite.Options{})
			require.NoError(t, err)
			defer rd.Close()
			rep, err := verify.New(rd, verify.Opts{}).Check(context.Background())
			require.NoError(t, err)
			assert.ElementsMatch(t, tc.want, rules(rep), "%+v", rep.Violations)
		})
	}
}

// TestVerifier_incrementalScansEveryPayloadRow: an incremental run trusts
// the receipts up to its pinned head, not their values (SPEC §14:
// --incremental still scans every payload row): a value edited, or put
// in a field the chain holds empty, before the pin is found.
func TestVerifier_incrementalScansEveryPayloadRow(t *testing.T) {
	base := buildCommitted(t)
	unguard := []string{`DROP TRIGGER ns_payloads_erase_only`}
	for _, tc := range []struct {
		desc  string
		steps []string
		want  []string
	}{
		{"intact", nil, nil},
		{"a value edited before the pin", []string{`UPDATE ns_payloads SET result = '{"to":"Joe"}' WHERE rid = ` + rid("2")},
			[]string{verify.RulePayloadMismatch}},
		{"a value kept for a field the chain has empty, before the pin", []string{`UPDATE ns_payloads SET note = 'x', note_salt = randomblob(16) WHERE rid = ` + rid("4")},
			[]string{verify.RulePayloadUnexpected}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			rd, err := sqlite.OpenReader(context.Background(), base, sqlite.Options{})
			require.NoError(t, err)
			head, err := rd.ReadHead(context.Background())
			require.NoError(t, err)
			require.NoError(t, rd.Close())
			path := tamperedCopy(t, base, unguard, tc.steps, 0)
			rd, err = sqlite.OpenReader(context.Background(), path, sqlite.Options{})
			require.NoError(t, err)
			defer rd.Close()
			pin := &verify.Pin{Seq: head.Seq, Hash: head.Hash.String()}
			rep, err := verify.New(rd, verify.Opts{Pinned: pin, Incremental: true}).Check(context.Background())
			require.NoError(t, err)
			assert.Equal(t, uint64(0), rep.Checked, "nothing after the pin is rehashed")
			assert.ElementsMatch(t, tc.want, rules(rep), "%+v", rep.Violations)
		})
	}
}

// TestVerifier_retentionEraseOfKeyInFlight: a retention sweep erases the
// values of finished keys only (SPEC §14). A sweep's erase forged to list
// the not_applied outcome of a key that was reserved again — in flight
// when the sweep ran — is erase_invalid, though its set, count and the
// payload marks agree with the forged ranges.
func TestVerifier_retentionEraseOfKeyInFlight(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	db := ledgertest.Open(t, ledgertest.WithPath(path), ledgertest.WithStore(sqlite.Options{Payloads: ledger.PayloadsCommitted}))
	ctx := context.Background()
	_, err := db.SetPolicy(ctx, json.RawMessage(`{"retention":{"payloads_ms":60000}}`), "admin") // 1
	require.NoError(t, err)
	a := testkit.MustReserve(t, db, testkit.ReserveReq("pay-key-0001", "exec-1"))                              // 2
	testkit.MustCommit(t, db, testkit.Succeed("pay-key-0001", a.Reservation))                                  // 3
	b := testkit.MustReserve(t, db, testkit.ReserveReq("pay-key-0002", "exec-1"))                              // 4
	testkit.MustCommit(t, db, ledger.CommitRequest{IdempotencyKey: "pay-key-0002", Reservation: b.Reservation, // 5
		Outcome: chain.OutcomeNotApplied, Error: &ledger.FailureDetail{Code: "DECLINED", Message: "card declined"}})
	testkit.MustReserve(t, db, testkit.ReserveReq("pay-key-0002", "exec-2")) // 6: in flight again
	db.Clock.Advance(61 * time.Second)
	swept, err := db.Sweep(ctx) // 7: erases 3 only
	require.NoError(t, err)
	require.Equal(t, uint64(7), swept.Receipt.Seq)
	require.Equal(t, uint64(1), swept.Count)
	require.NoError(t, db.Close())

	intact := func(path string) []string {
		rd, err := sqlite.OpenReader(ctx, path, sqlite.Options{})
		require.NoError(t, err)
		defer rd.Close()
		rep, err := verify.New(rd, verify.Opts{}).Check(ctx)
		require.NoError(t, err)
		return rules(rep)
	}
	require.Empty(t, intact(path), "the sweep as the ledger made it")

	var saltBytes []byte
	testkit.EditLedger(t, path, func(sdb *sql.DB) {
		require.NoError(t, sdb.QueryRow(`SELECT salt FROM ns_erasures WHERE ns = 0 AND seq = 7`).Scan(&saltBytes))
	})
	salt, err := chain.SaltFromBytes(saltBytes)
	require.NoError(t, err)
	ranges := []chain.Range{{3, 3}, {5, 5}}
	res := chain.EraseResult{Set: chain.SetDigest(salt, ranges), Count: 2, Fields: chain.AllFields.Names(), Retention: true}
	steps := stepsOf([]string{
		`DROP TRIGGER ns_payloads_erase_only`, `DROP TRIGGER ns_erasures_fixed`,
		`UPDATE ns_erasures SET ranges = '` + chain.RangesText(ranges) + `' WHERE ns = 0 AND seq = 7`,
		`UPDATE ns_payloads SET error_message = NULL, error_message_salt = NULL, error_message_erased = 7 WHERE rid = ` + rid("5"),
		`UPDATE ns_receipts SET result = '` + res.Text() + `' WHERE ns = 0 AND seq = 7`,
	})
	steps[len(steps)-1].RehashFrom = 7
	tamper(t, path, tamperCase{Steps: steps})
	assert.Equal(t, []string{verify.RuleEraseInvalid}, intact(path))
}
