package verify_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
	"github.com/effect-ledger/effect-ledger/verify"
)

var _ verify.DB = (*sqlite.Reader)(nil)

// server is the ledger served at url, read with the client module.
func server(t testing.TB, url string) verify.Server {
	t.Helper()
	c, err := client.New(url)
	require.NoError(t, err)
	return verify.Server{Client: c}
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// post sends a JSON request to the test server and returns the decoded body.
func post(t *testing.T, srv *httptest.Server, path, body string, wantStatus int) map[string]any {
	t.Helper()
	res, err := srv.Client().Post(srv.URL+path, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	require.Equal(t, wantStatus, res.StatusCode, "%s %s: %s", path, body, raw)
	var out map[string]any
	require.NoError(t, json.Unmarshal(raw, &out))
	return out
}

// buildLedger produces, through the HTTP API, a ledger with ten receipts:
//
//	1 reserve  pay-key-0001 exec-1 (idempotent)   6 reserve  mail-key-001 exec-3 attempt 2 (retry)
//	2 commit   pay-key-0001 succeeded             7 commit   mail-key-001 succeeded
//	3 replay   pay-key-0001 exec-2                8 reserve  charge-key-1 exec-4 (lease 10 ms)
//	4 reserve  mail-key-001 exec-3 (idempotent)   9 resolve  charge-key-1 failed
//	5 commit   mail-key-001 failed, retryable    10 reserve  open-key-001 exec-5
func buildLedger(t *testing.T) (path string, now time.Time) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "ledger.db")
	db := ledgertest.Open(t, ledgertest.WithPath(path), ledgertest.Inline())
	c := db.Clock
	srv := httptest.NewServer(api.NewServer(db.Ledger, api.Config{Logger: quiet}))
	defer func() { srv.Close(); require.NoError(t, db.Close()) }()

	r := post(t, srv, "/v1/effects/reserve", `{"idempotency_key":"pay-key-0001","execution_id":"exec-1","tool":"payments.refund","effect":"write","idempotent":true,"input":{"order":7}}`, 201)
	post(t, srv, "/v1/effects/pay-key-0001/commit", `{"reservation":"`+r["reservation"].(string)+`","outcome":"succeeded","external_ref":"re_1","result":{"amount":1200}}`, 201)
	post(t, srv, "/v1/effects/reserve", `{"idempotency_key":"pay-key-0001","execution_id":"exec-2","tool":"payments.refund","effect":"write","input":{"order":7}}`, 200)
	r = post(t, srv, "/v1/effects/reserve", `{"idempotency_key":"mail-key-001","execution_id":"exec-3","tool":"email.send","effect":"external","idempotent":true,"input":{"to":"a@b.c"}}`, 201)
	post(t, srv, "/v1/effects/mail-key-001/commit", `{"reservation":"`+r["reservation"].(string)+`","outcome":"failed","error":{"code":"TIMEOUT","retryable":true}}`, 201)
	r = post(t, srv, "/v1/effects/reserve", `{"idempotency_key":"mail-key-001","execution_id":"exec-3","attempt":2,"tool":"email.send","effect":"external","idempotent":true}`, 201)
	post(t, srv, "/v1/effects/mail-key-001/commit", `{"reservation":"`+r["reservation"].(string)+`","outcome":"succeeded","external_ref":"msg_1"}`, 201)
	post(t, srv, "/v1/effects/reserve", `{"idempotency_key":"charge-key-1","execution_id":"exec-4","tool":"payments.charge","effect":"write","lease_ms":10}`, 201)
	c.Advance(time.Second)
	post(t, srv, "/v1/effects/charge-key-1/resolve", `{"outcome":"failed","error":{"code":"NOT_CHARGED"},"note":"checked the PSP"}`, 201)
	post(t, srv, "/v1/effects/reserve", `{"idempotency_key":"open-key-001","execution_id":"exec-5","tool":"payments.charge","effect":"write","lease_ms":1000}`, 201)
	return path, c.Now().Add(time.Hour)
}

// tamperCase is one entry of testdata/tamper.json.
type tamperCase struct {
	Desc  string `json:"desc"`
	Steps []struct {
		SQL        string `json:"sql"`
		RehashFrom uint64 `json:"rehash_from"`
	} `json:"steps"`
	PinOriginalHead bool     `json:"pin_original_head"`
	OfflineOnly     bool     `json:"offline_only"`
	Want            []string `json:"want"`
	// Exact: no rule outside Want may be reported.
	Exact bool `json:"exact"`
}

// tamper drops the append-only and linking triggers on path and applies
// the steps, then covers its tracks as a careful forger would: the
// recorded head is set to the forged tail, so that ledgerd serves the file.
func tamper(t *testing.T, path string, tc tamperCase) {
	t.Helper()
	testkit.EditLedger(t, path, func(db *sql.DB) {
		_, err := db.Exec(`DROP TRIGGER ns_receipts_link; DROP TRIGGER ns_receipts_advance_head;`)
		require.NoError(t, err)
		for _, s := range tc.Steps {
			if s.SQL != "" {
				_, err := db.Exec(s.SQL)
				require.NoError(t, err, s.SQL)
			}
			if s.RehashFrom > 0 {
				rehash(t, db, s.RehashFrom)
			}
		}
		_, err = db.Exec(`UPDATE ns_head SET seq = t.seq, hash = t.hash FROM (SELECT seq, hash FROM receipts ORDER BY seq DESC LIMIT 1) AS t WHERE ns = 0`)
		require.NoError(t, err)
	})
}

// rehash recomputes prev_hash and hash from seq on, as a forger would.
func rehash(t *testing.T, db *sql.DB, from uint64) {
	t.Helper()
	prev := chain.ZeroHash
	if from > 1 {
		var h []byte
		require.NoError(t, db.QueryRow(`SELECT hash FROM receipts WHERE seq = ?`, from-1).Scan(&h))
		copy(prev[:], h)
	}
	rows, err := db.Query(`SELECT seq, kind, idempotency_key, key_generated, execution_id, attempt, tool,
		effect, idempotent, input_hash, outcome, external_ref, result, error_code, error_message,
		retryable, lease_expires_at, ref_seq, actor, note, recorded_at FROM receipts WHERE seq >= ? ORDER BY seq`, from)
	require.NoError(t, err)
	var rs []chain.Receipt
	for rows.Next() {
		var r chain.Receipt
		require.NoError(t, rows.Scan(&r.Seq, &r.Kind, &r.IdempotencyKey, &r.KeyGenerated, &r.ExecutionID, &r.Attempt,
			&r.Tool, &r.Effect, &r.Idempotent, &r.InputHash, &r.Outcome, &r.ExternalRef, &r.Result,
			&r.ErrorCode, &r.ErrorMessage, &r.Retryable, &r.LeaseExpiresAt, &r.RefSeq, &r.Actor, &r.Note, &r.RecordedAt))
		rs = append(rs, r)
	}
	require.NoError(t, rows.Close())
	for _, r := range rs {
		h := r.ComputeHash(prev)
		_, err := db.Exec(`UPDATE receipts SET prev_hash = ?, hash = ? WHERE seq = ?`, prev[:], h[:], r.Seq)
		require.NoError(t, err)
		prev = h
	}
}

// openForServing opens a tampered file for the online checks the way the
// forger gets ledgerd to serve it: keys that point past a truncated chain
// are rebuilt first (rebuild-index), or ledgerd would refuse the file.
func openForServing(t *testing.T, path string) *ledgertest.DB {
	t.Helper()
	db, err := ledgertest.TryOpen(t, ledgertest.WithPath(path))
	if errors.Is(err, ledger.ErrDerivedState) {
		_, rerr := sqlite.RebuildIndex(context.Background(), path, ledger.DefaultNamespace, sqlite.Options{Logger: quiet})
		require.NoError(t, rerr)
		db, err = ledgertest.TryOpen(t, ledgertest.WithPath(path))
	}
	require.NoError(t, err)
	return db
}

func rules(rep *verify.Report) []string {
	var out []string
	for _, v := range rep.Violations {
		if !contains(out, v.Rule) {
			out = append(out, v.Rule)
		}
	}
	return out
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// forEachTamper runs fn, in a subtest per case of testdata/tamper.json, on
// a tampered copy of a real 10-receipt ledger, with the options the case
// asks for (the clock of the ledger; its original head pinned).
func forEachTamper(t *testing.T, fn func(t *testing.T, tc tamperCase, path string, opts verify.Opts)) {
	t.Helper()
	base, now := buildLedger(t)
	rd, err := sqlite.OpenReader(context.Background(), base, sqlite.Options{})
	require.NoError(t, err)
	head, err := rd.ReadHead(context.Background())
	require.NoError(t, err)
	require.NoError(t, rd.Close())
	require.Equal(t, uint64(10), head.Seq)
	raw, err := os.ReadFile("testdata/tamper.json")
	require.NoError(t, err)
	var cases []tamperCase
	require.NoError(t, json.Unmarshal(raw, &cases))
	require.NotEmpty(t, cases)
	for _, tc := range cases {
		t.Run(tc.Desc, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "tampered.db")
			testkit.CopyFile(t, base, path)
			tamper(t, path, tc)
			opts := verify.Opts{Now: func() time.Time { return now }}
			if tc.PinOriginalHead {
				opts.ExpectHead = &verify.Pin{Seq: head.Seq, Hash: head.Hash.String()}
			}
			fn(t, tc, path, opts)
		})
	}
}

// TestVerifier_tamper runs every case of testdata/tamper.json against a
// copy of a real ledger, offline (the SQLite file) and online (a server
// on the tampered file).
func TestVerifier_tamper(t *testing.T) {
	forEachTamper(t, func(t *testing.T, tc tamperCase, path string, opts verify.Opts) {
		rd, err := sqlite.OpenReader(context.Background(), path, sqlite.Options{})
		require.NoError(t, err)
		defer rd.Close()
		rep, err := verify.New(rd, opts).Check(context.Background())
		require.NoError(t, err)
		check := func(src string, rep *verify.Report) {
			got := rules(rep)
			for _, want := range tc.Want {
				assert.Contains(t, got, want, "%s: violations %+v", src, rep.Violations)
			}
			if tc.Exact {
				assert.ElementsMatch(t, tc.Want, got, "%s: violations %+v", src, rep.Violations)
			}
			if len(tc.Want) == 0 {
				assert.Empty(t, rep.Violations, src)
				assert.True(t, rep.OK, src)
			} else {
				assert.False(t, rep.OK, src)
			}
			for _, v := range rep.Violations {
				assert.NotEmpty(t, v.Detail)
			}
		}
		check("offline", rep)
		if tc.OfflineOnly {
			return
		}
		db := openForServing(t, path)
		srv := httptest.NewServer(api.NewServer(db.Ledger, api.Config{Logger: quiet}))
		defer func() { srv.Close(); _ = db.Close() }()
		rep, err = verify.NewRemote(server(t, srv.URL), opts).Check(context.Background())
		require.NoError(t, err)
		check("online", rep)
	})
}

func TestVerifier_pins(t *testing.T) {
	base, now := buildLedger(t)
	rd, err := sqlite.OpenReader(context.Background(), base, sqlite.Options{})
	require.NoError(t, err)
	defer rd.Close()
	ctx := context.Background()
	opts := func(o verify.Opts) verify.Opts { o.Now = func() time.Time { return now }; return o }

	rep, err := verify.New(rd, opts(verify.Opts{})).Check(ctx)
	require.NoError(t, err)
	require.True(t, rep.OK, "%+v", rep.Violations)
	assert.Equal(t, uint64(10), rep.Receipts)
	assert.Equal(t, uint64(10), rep.Checked)
	head := rep.Head

	t.Run("expect head OK", func(t *testing.T) {
		mid, _, err := rd.ListReceipts(ctx, ledger.ReceiptFilter{After: 4, Limit: 1})
		require.NoError(t, err)
		rep, err := verify.New(rd, opts(verify.Opts{ExpectHead: &verify.Pin{Seq: 5, Hash: mid[0].Hash.String()}})).Check(ctx)
		require.NoError(t, err)
		assert.True(t, rep.OK)
	})
	t.Run("ErrHeadMismatch wrong hash", func(t *testing.T) {
		rep, err := verify.New(rd, opts(verify.Opts{ExpectHead: &verify.Pin{Seq: 5, Hash: strings.Repeat("ab", 32)}})).Check(ctx)
		require.NoError(t, err)
		assert.Equal(t, []string{"head_mismatch"}, rules(rep))
		assert.Contains(t, rep.Violations[0].Detail, strings.Repeat("ab", 32), "detail names the claimed value")
	})
	t.Run("ErrHeadMismatch beyond the chain", func(t *testing.T) {
		rep, err := verify.New(rd, opts(verify.Opts{ExpectHead: &verify.Pin{Seq: 11, Hash: head.Hash}})).Check(ctx)
		require.NoError(t, err)
		assert.Equal(t, []string{"head_mismatch"}, rules(rep))
	})
	t.Run("incremental", func(t *testing.T) {
		rep, err := verify.New(rd, opts(verify.Opts{Pinned: &verify.Pin{Seq: 6, Hash: mustHash(t, rd, 6)}, Incremental: true})).Check(ctx)
		require.NoError(t, err)
		assert.True(t, rep.OK, "%+v", rep.Violations)
		assert.Equal(t, uint64(10), rep.Receipts, "receipts counts the whole chain")
		assert.Equal(t, uint64(4), rep.Checked, "only receipts after the pin are rehashed")
		assert.Equal(t, head, rep.Head)
		rep, err = verify.New(rd, opts(verify.Opts{Pinned: &verify.Pin{Seq: 6, Hash: strings.Repeat("0", 64)}, Incremental: true})).Check(ctx)
		require.NoError(t, err)
		assert.Equal(t, []string{"head_mismatch"}, rules(rep))
	})
	t.Run("ErrIncrementalNeedsPin", func(t *testing.T) {
		_, err := verify.New(rd, verify.Opts{Incremental: true}).Check(ctx)
		assert.ErrorIs(t, err, verify.ErrIncrementalNeedsPin)
	})
}

func mustHash(t *testing.T, rd *sqlite.Reader, seq uint64) string {
	r, err := rd.GetReceipt(context.Background(), seq)
	require.NoError(t, err)
	return r.Hash.String()
}

func TestVerifier_maxViolations(t *testing.T) {
	base, now := buildLedger(t)
	path := filepath.Join(t.TempDir(), "t.db")
	testkit.CopyFile(t, base, path)
	tamper(t, path, tamperCase{Steps: []struct {
		SQL        string `json:"sql"`
		RehashFrom uint64 `json:"rehash_from"`
	}{{SQL: "UPDATE receipts SET actor = 'someone'"}}})
	rd, err := sqlite.OpenReader(context.Background(), path, sqlite.Options{})
	require.NoError(t, err)
	defer rd.Close()
	rep, err := verify.New(rd, verify.Opts{MaxViolations: 3, Now: func() time.Time { return now }}).Check(context.Background())
	require.NoError(t, err)
	assert.Len(t, rep.Violations, 3)
	assert.Equal(t, 10, rep.ViolationsTotal)
}

// TestVerifier_incremental checks incremental runs against both sources:
// they trust the receipts up to the pin only while the pinned receipt is
// there and still hashes to the pin; otherwise they check the whole chain
// and report its real length and head.
func TestVerifier_incremental(t *testing.T) {
	base, now := buildLedger(t)
	ctx := context.Background()
	rd, err := sqlite.OpenReader(ctx, base, sqlite.Options{})
	require.NoError(t, err)
	hashes := map[uint64]string{}
	require.NoError(t, rd.Receipts(ctx, 0, func(r *chain.Receipt) error { hashes[r.Seq] = r.Hash.String(); return nil }))
	require.NoError(t, rd.Close())
	pin := func(seq uint64) *verify.Pin { return &verify.Pin{Seq: seq, Hash: hashes[seq]} }

	for _, tc := range []struct {
		desc         string
		sql          string
		rehashFrom   uint64
		opts         verify.Opts
		wantRules    []string
		wantReceipts uint64
		wantHead     uint64
		wantChecked  uint64
	}{
		{desc: "OK", opts: verify.Opts{Pinned: pin(6)},
			wantReceipts: 10, wantHead: 10, wantChecked: 4},
		{desc: "OK with an expected head below the pin", opts: verify.Opts{Pinned: pin(6), ExpectHead: pin(3)},
			wantReceipts: 10, wantHead: 10, wantChecked: 4},
		{desc: "ErrHeadMismatch expected head below the pin", opts: verify.Opts{Pinned: pin(6), ExpectHead: &verify.Pin{Seq: 3, Hash: hashes[4]}},
			wantRules: []string{"head_mismatch"}, wantReceipts: 10, wantHead: 10, wantChecked: 10},
		{desc: "ErrHeadMismatch truncated below the pin", sql: "DELETE FROM receipts WHERE seq >= 9", opts: verify.Opts{Pinned: pin(10)},
			wantRules: []string{"head_mismatch"}, wantReceipts: 8, wantHead: 8, wantChecked: 8},
		{desc: "ErrHeadMismatch truncated to nothing", sql: "DELETE FROM receipts", opts: verify.Opts{Pinned: pin(10)},
			wantRules: []string{"head_mismatch"}, wantReceipts: 0, wantHead: 0, wantChecked: 0},
		{desc: "ErrHeadMismatch truncated, pinned twice", sql: "DELETE FROM receipts WHERE seq >= 9", opts: verify.Opts{Pinned: pin(10), ExpectHead: pin(10)},
			wantRules: []string{"head_mismatch"}, wantReceipts: 8, wantHead: 8, wantChecked: 8},
		{desc: "ErrHeadMismatch pinned receipt rewritten with the suffix", sql: "UPDATE receipts SET external_ref = 'msg_forged' WHERE seq = 7", rehashFrom: 7,
			opts: verify.Opts{Pinned: pin(7)}, wantRules: []string{"head_mismatch"}, wantReceipts: 10, wantHead: 10, wantChecked: 10},
		{desc: "ErrHashMismatch pinned receipt edited in place", sql: "UPDATE receipts SET external_ref = 'msg_forged' WHERE seq = 7",
			opts: verify.Opts{Pinned: pin(7)}, wantRules: []string{"hash_mismatch"}, wantReceipts: 10, wantHead: 10, wantChecked: 10},
		{desc: "recorded_at of the first receipt after the pin before the pinned one's", sql: "UPDATE receipts SET recorded_at = recorded_at - 3600000 WHERE seq = 10", rehashFrom: 10,
			opts: verify.Opts{Pinned: pin(9)}, wantRules: []string{"recorded_at_decreased"}, wantReceipts: 10, wantHead: 10, wantChecked: 1},
		{desc: "ErrInvalidField pinned receipt malformed in place", sql: "UPDATE receipts SET attempt = 'two' WHERE seq = 7",
			opts: verify.Opts{Pinned: pin(7)}, wantRules: []string{"invalid_field"}, wantReceipts: 10, wantHead: 10, wantChecked: 10},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "t.db")
			testkit.CopyFile(t, base, path)
			c := tamperCase{}
			if tc.sql != "" {
				c.Steps = append(c.Steps, struct {
					SQL        string `json:"sql"`
					RehashFrom uint64 `json:"rehash_from"`
				}{SQL: tc.sql, RehashFrom: tc.rehashFrom})
			}
			tamper(t, path, c)
			opts := tc.opts
			opts.Incremental, opts.Now = true, func() time.Time { return now }
			check := func(src string, rep *verify.Report) {
				n := 0
				for _, v := range rep.Violations {
					if v.Rule == "head_mismatch" {
						n++
					}
				}
				for _, want := range tc.wantRules {
					assert.Contains(t, rules(rep), want, "%s: %+v", src, rep.Violations)
				}
				assert.Equal(t, len(tc.wantRules) == 0, rep.OK, "%s: %+v", src, rep.Violations)
				assert.LessOrEqual(t, n, 1, "%s: head_mismatch once: %+v", src, rep.Violations)
				assert.Equal(t, tc.wantReceipts, rep.Receipts, "%s: receipts", src)
				assert.Equal(t, tc.wantHead, rep.Head.Seq, "%s: head", src)
				want := chain.ZeroHash.String()
				if tc.wantHead > 0 {
					want = hashes[tc.wantHead]
				}
				if tc.rehashFrom == 0 || tc.wantHead < tc.rehashFrom {
					assert.Equal(t, want, rep.Head.Hash, "%s: head hash", src)
				}
				assert.Equal(t, tc.wantChecked, rep.Checked, "%s: rehashed", src)
			}
			rd, err := sqlite.OpenReader(ctx, path, sqlite.Options{})
			require.NoError(t, err)
			defer rd.Close()
			rep, err := verify.New(rd, opts).Check(ctx)
			require.NoError(t, err)
			check("offline", rep)

			db := openForServing(t, path)
			srv := httptest.NewServer(api.NewServer(db.Ledger, api.Config{Logger: quiet}))
			defer func() { srv.Close(); _ = db.Close() }()
			rep, err = verify.NewRemote(server(t, srv.URL), opts).Check(ctx)
			require.NoError(t, err)
			check("online", rep)
		})
	}
}

// TestVerifier_reconcileByAnotherActor: a reconcile by another actor than
// its reserve's is reconcile_not_allowed unless the verifier knows the
// actor as an admin (Opts.Admin), and not decided without Opts.Admin.
func TestVerifier_reconcileByAnotherActor(t *testing.T) {
	base, now := buildLedger(t)
	path := filepath.Join(t.TempDir(), "tampered.db")
	testkit.CopyFile(t, base, path)
	var tc tamperCase
	require.NoError(t, json.Unmarshal([]byte(`{"steps": [
		{"sql": "INSERT INTO receipts VALUES (11, 'policy', '', 0, '', 0, '', '', 0, '', '', '', '{\"rules\":[{\"reconcile\":{\"allow\":true},\"tool\":\"payments.*\"}]}', '', '', 0, 0, 0, '', '', (SELECT max(recorded_at) FROM receipts) + 1000, randomblob(32), randomblob(32))"},
		{"sql": "INSERT INTO receipts SELECT 12, 'reconcile', idempotency_key, key_generated, execution_id, attempt, tool, effect, idempotent, input_hash, 'succeeded', 'ch_1', '', '', '', 0, 0, 10, 'mallory', '{\"answer\":{},\"lookup\":\"q\"}', (SELECT max(recorded_at) FROM receipts) + 2000, randomblob(32), randomblob(32) FROM receipts WHERE seq = 10"},
		{"rehash_from": 11}]}`), &tc))
	tamper(t, path, tc)
	rd, err := sqlite.OpenReader(context.Background(), path, sqlite.Options{})
	require.NoError(t, err)
	defer rd.Close()
	for _, c := range []struct {
		desc  string
		admin func(string) bool
		want  []string
	}{
		{"admins unknown", nil, nil},
		{"not an admin", func(a string) bool { return a == "ops" }, []string{verify.RuleReconcileNotAllowed}},
		{"an admin", func(a string) bool { return a == "mallory" }, nil},
	} {
		rep, err := verify.New(rd, verify.Opts{Now: func() time.Time { return now }, Admin: c.admin}).Check(context.Background())
		require.NoError(t, err)
		assert.Equal(t, c.want, rules(rep), "%s: %+v", c.desc, rep.Violations)
	}
}
