package test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/testkit"
)

// Issue 44, the ledger's items: a stored result is served only as the
// chain recorded it (item 2), a corrupt database page is storage_corrupt
// (item 9), the read views report approvals as they are (item 7), and
// input_hash has one form (item 8).

// integrityResult is the committed result the tampering changes.
const integrityResult = `{"amount":1200,"currency":"eur"}`

// commitRefund reserves and commits key with integrityResult and returns
// the commit receipt.
func commitRefund(t *testing.T, l *Ledgerd, key string) chain.Receipt {
	t.Helper()
	tok := l.Reserve(t, reserve(key, "exec-1", 1, false))
	c := l.Commit(t, key, testkit.CommitBody(tok, "succeeded", `,"external_ref":"re_3Pq9","result":`+integrityResult))
	g := l.Do("GET", "/v1/receipts/"+jsonNum(c.Body["receipt"].(map[string]any)["seq"]), "")
	require.Equal(t, 200, g.Status, g.Raw)
	var rc chain.Receipt
	require.NoError(t, json.Unmarshal([]byte(g.Raw), &rc))
	return rc
}

func jsonNum(v any) string { b, _ := json.Marshal(v); return string(b) }

// tamperResult changes the stored result of receipt seq of the default
// namespace to result, with the stored hash set to hash when not nil:
// in place in the SQLite file (one byte edited, the way a disk or a
// person changes it, when hash is nil) or by an UPDATE on PostgreSQL.
func tamperResult(t *testing.T, db string, seq uint64, result string, hash *chain.Hash) {
	t.Helper()
	if strings.HasPrefix(db, "postgres") {
		conn, err := pgx.Connect(context.Background(), db)
		require.NoError(t, err)
		defer conn.Close(context.Background())
		_, err = conn.Exec(context.Background(), `ALTER TABLE receipts DISABLE TRIGGER USER`)
		require.NoError(t, err)
		q := `UPDATE receipts SET result = $1 WHERE namespace = 'default' AND seq = $2`
		args := []any{result, int64(seq)}
		if hash != nil {
			q = `UPDATE receipts SET result = $1, hash = $3 WHERE namespace = 'default' AND seq = $2`
			args = append(args, hash[:])
		}
		_, err = conn.Exec(context.Background(), q, args...)
		require.NoError(t, err)
		return
	}
	if wal, err := os.Stat(db + "-wal"); err == nil {
		require.Zero(t, wal.Size(), "ledgerd checkpoints its WAL when it stops")
	}
	if hash == nil {
		b, err := os.ReadFile(db)
		require.NoError(t, err)
		require.Equal(t, 1, bytes.Count(b, []byte(integrityResult)), "the result is stored once")
		require.NoError(t, os.WriteFile(db, bytes.Replace(b, []byte(integrityResult), []byte(result), 1), 0o600))
		return
	}
	sdb, err := sql.Open("sqlite3", "file:"+db)
	require.NoError(t, err)
	defer sdb.Close()
	var trigger string
	require.NoError(t, sdb.QueryRow(`SELECT sql FROM sqlite_master WHERE name = 'ns_receipts_no_update'`).Scan(&trigger))
	for _, q := range []string{`DROP TRIGGER ns_receipts_no_update`, `UPDATE ns_receipts SET result = ?, hash = ? WHERE ns = 0 AND seq = ?`, trigger} {
		var args []any
		if strings.HasPrefix(q, "UPDATE") {
			args = []any{result, hash[:], seq}
		}
		_, err := sdb.Exec(q, args...)
		require.NoError(t, err, q)
	}
}

// TestHardening4_replayIntegrity (issue 44, item 2): a committed result
// changed in storage is never replayed or shown. The replay and GET
// answer 500 integrity_error without the value, nothing is appended,
// /readyz turns 503, the refusal is logged (without the value) and
// counted. Changed in place (one byte: the stored hash no longer
// matches) and rewritten with a matching hash (the next receipt's
// prev_hash, or the head, no longer matches).
func TestHardening4_replayIntegrity(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		desc    string
		rehash  bool
		follows bool // another receipt follows the commit
	}{
		{"one byte edited", false, true},
		{"result and hash rewritten, head", true, false},
		{"result and hash rewritten, next receipt", true, true},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			t.Parallel()
			onSQLiteAndPostgres(t, func(t *testing.T, db string) {
				testReplayIntegrity(t, db, tt.rehash, tt.follows)
			})
		})
	}
}

func testReplayIntegrity(t *testing.T, db string, rehash, follows bool) {
	l := StartLedgerd(t, db, "--default-payloads", "inline") // the result is edited in the chain
	const key = "refund-order-1234"
	rc := commitRefund(t, l, key)
	if follows {
		ok := l.Do("POST", "/v1/effects/reserve", reserve(key, "exec-2", 1, false))
		require.Equal(t, 200, ok.Status, "an intact result replays: %s", ok.Raw)
	}
	require.NoError(t, l.Stop())

	// The forged currency has the length of the real one (the file is
	// edited byte for byte) and letters no time, hash or port in a log
	// line carries by chance.
	const forgedValue = "xqz"
	tampered := strings.Replace(integrityResult, "eur", forgedValue, 1)
	var hash *chain.Hash
	if rehash {
		forged := rc
		forged.Result = tampered
		h := forged.ComputeHash(rc.PrevHash)
		hash = &h
	}
	tamperResult(t, db, rc.Seq, tampered, hash)

	if rehash && !follows {
		// The head row no longer names the last receipt's hash: a ledger
		// whose head disagrees with its chain does not open, on either
		// driver (derived state), so nothing is served at all.
		out, code := runLedgerdBounded(t, "--db", db, "--listen", "127.0.0.1:0")
		assert.Equal(t, 1, code, out)
		assert.Regexp(t, `but (its|the) receipts end at 2 \(`, out)
		assert.NotContains(t, out, forgedValue)
		return
	}
	l = StartLedgerd(t, db)
	require.Equal(t, 200, l.Do("GET", "/readyz", "").Status, "nothing read the receipt yet")
	head := l.Do("GET", "/v1/head", "")
	for _, r := range []Resp{
		l.Do("POST", "/v1/effects/reserve", reserve(key, "exec-3", 1, false)),
		l.Do("GET", "/v1/effects/"+key, ""),
	} {
		assert.Equal(t, 500, r.Status, r.Raw)
		assert.Equal(t, "integrity_error", r.Code(), r.Raw)
		assert.NotContains(t, r.Raw, forgedValue, "the tampered value is never served")
		assert.NotContains(t, r.Raw, "1200")
	}
	assert.Equal(t, head.Raw, l.Do("GET", "/v1/head", "").Raw, "no replay receipt was appended")
	ready := l.Do("GET", "/readyz", "")
	assert.Equal(t, 503, ready.Status, ready.Raw)
	assert.Contains(t, ready.Raw, "integrity_error")
	fams := metricFamilies(t, l)
	require.Contains(t, fams, "ledger_integrity_errors_total")
	var n float64
	for _, m := range fams["ledger_integrity_errors_total"].Metric {
		n += m.GetCounter().GetValue()
	}
	assert.Equal(t, 2.0, n, "the replay and the GET")
	assert.Contains(t, l.Logs(), "stored receipt does not match the chain")
	assert.NotContains(t, l.Logs(), forgedValue, "the log never carries the value")
}

// TestHardening4_corruptPage (issue 44, item 9): a SQLite file with a
// corrupt page (one the open does not read) starts, and a request that
// reads the page answers 503 storage_corrupt, not 500 internal; from
// then on /readyz answers 503.
func TestHardening4_corruptPage(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "ledger.db")
	l := StartLedgerd(t, db)
	pad := strings.Repeat("x", 400)
	for i := range 60 {
		key := fmt.Sprintf("page-key-%04d", i)
		tok := l.Reserve(t, reserve(key, "exec-1", 1, false))
		l.Commit(t, key, testkit.CommitBody(tok, "succeeded", `,"result":{"pad":"`+pad+`"}`))
	}
	require.NoError(t, l.Stop())

	b, err := os.ReadFile(db)
	require.NoError(t, err)
	sdb, err := sql.Open("sqlite3", "file:"+db+"?mode=ro")
	require.NoError(t, err)
	var pageSize int
	require.NoError(t, sdb.QueryRow(`PRAGMA page_size`).Scan(&pageSize))
	require.NoError(t, sdb.Close())
	at := bytes.Index(b, []byte("page-key-0020"))
	require.Positive(t, at)
	page := at / pageSize
	require.Less(t, page, len(b)/pageSize-2, "a page in the middle of the file")
	for i := page * pageSize; i < page*pageSize+8; i++ {
		b[i] = 0xff // the b-tree page header: no valid page type
	}
	require.NoError(t, os.WriteFile(db, b, 0o600))

	l = StartLedgerd(t, db)
	require.Equal(t, 200, l.Do("GET", "/readyz", "").Status, "nothing read the page yet")
	for _, r := range []Resp{
		l.Do("GET", "/v1/effects/page-key-0020", ""),
		l.Do("POST", "/v1/effects/reserve", reserve("page-key-0020", "exec-2", 1, false)),
	} {
		assert.Equal(t, 503, r.Status, r.Raw)
		assert.Equal(t, "storage_corrupt", r.Code(), r.Raw)
	}
	ready := l.Do("GET", "/readyz", "")
	assert.Equal(t, 503, ready.Status, ready.Raw)
	assert.Contains(t, ready.Raw, "storage_corrupt")
}

// TestHardening4_approvalViews (issue 44, item 7): an approved ask not
// yet consumed is "approved" in GET /v1/effects/{key} and in ledgerctl
// show (--server and --db, which showed unknown_key for a key with only an
// ask and its answer); a second approver answering an answered ask gets
// 409 already_answered, while the approver who answered may repeat it.
func TestHardening4_approvalViews(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, testApprovalViews)
}

func testApprovalViews(t *testing.T, db string) {
	clock := newWallClock(t)
	f := newGateFixture(t, clock, db)
	require.NoError(t, f.l.Stop())
	bob := createToken(t, db, "bob", "approver")
	f.l = clock.start(t, db)
	policy := strings.Replace(approvalPolicy, `"expires_in_ms":60000`, `"expires_in_ms":3600000`, 1)
	r := f.l.Do("PUT", "/v1/namespaces/default/policy", policy, f.as(f.admin)...)
	require.Equal(t, 200, r.Status, r.Raw)

	const key = "pay-view-0001"
	a := f.reserve(f.agent, key, "e1", "payments.charge", `{"amount":1200}`, "")
	require.Equal(t, 202, a.Status, a.Raw)
	seq := num(t, a.Body, "approval", "seq")
	k := f.l.Do("GET", "/v1/effects/"+key, "", f.as(f.reader)...)
	require.Equal(t, 200, k.Status, k.Raw)
	assert.Equal(t, "awaiting_approval", k.Body["state"])

	ok := f.answer(f.alice, seq, "approve", "fine")
	require.Equal(t, 201, ok.Status, ok.Raw)
	k = f.l.Do("GET", "/v1/effects/"+key, "", f.as(f.reader)...)
	require.Equal(t, 200, k.Status, k.Raw)
	assert.Equal(t, "approved", k.Body["state"], "approved, not consumed yet")

	for _, decision := range []string{"approve", "reject"} {
		second := f.answer(bob, seq, decision, "me too")
		assert.Equal(t, 409, second.Status, "another approver, %s: %s", decision, second.Raw)
		assert.Equal(t, "already_answered", second.Code(), second.Raw)
	}
	again := f.answer(f.alice, seq, "approve", "fine")
	assert.Equal(t, 200, again.Status, "the approver repeating its decision: %s", again.Raw)

	out, stderr, code := ledgerctl(t, "show", "--server", f.l.URL, "--token", f.reader, "--json", key)
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, "approved", jsonField(t, out, "state"), "show --server")
	out, stderr, code = ledgerctl(t, "show", "--db", db, "--json", key)
	require.Equal(t, 0, code, "show --db of a key with only an ask and its answer: %s", stderr)
	assert.Equal(t, "approved", jsonField(t, out, "state"), "show --db")

	run := f.reserve(f.agent, key, "e1", "payments.charge", `{"amount":1200}`, "")
	require.Equal(t, 201, run.Status, "the asker consumes the approval: %s", run.Raw)
	k = f.l.Do("GET", "/v1/effects/"+key, "", f.as(f.reader)...)
	assert.Equal(t, "reserved", k.Body["state"], k.Raw)
}

func jsonField(t *testing.T, s, name string) any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(s), &m), s)
	return m[name]
}

// TestHardening4_inputHashForm (issue 44, item 8): input_hash is
// "sha256:" and 64 lowercase hex digits; another spelling of the same
// fingerprint (upper case, no prefix) is 400 invalid_request naming the
// field, not a new fingerprint that the repeat guard and the fingerprint
// check would not recognise.
func TestHardening4_inputHashForm(t *testing.T) {
	t.Parallel()
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"))
	hexPart := strings.Repeat("5e88", 16)
	body := func(key, hash string) string {
		return `{"idempotency_key":"` + key + `","execution_id":"e1","tool":"mail.send","effect":"external","input_hash":"` + hash + `"}`
	}
	r := l.Do("POST", "/v1/effects/reserve", body("hash-form-0001", "sha256:"+hexPart))
	require.Equal(t, 201, r.Status, r.Raw)
	for _, hash := range []string{"SHA256:" + strings.ToUpper(hexPart), "sha256:" + strings.ToUpper(hexPart), hexPart, "sha256:" + hexPart[:62], "sha256:" + hexPart + "00"} {
		r := l.Do("POST", "/v1/effects/reserve", body("hash-form-0002", hash))
		assert.Equal(t, 400, r.Status, "%s: %s", hash, r.Raw)
		assert.Equal(t, "invalid_request", r.Code(), r.Raw)
		if e, ok := r.Body["error"].(map[string]any); ok {
			assert.Equal(t, "input_hash", e["details"].(map[string]any)["field"], r.Raw)
		}
	}
	same := l.Do("POST", "/v1/effects/reserve", body("hash-form-0001", "SHA256:"+strings.ToUpper(hexPart)))
	assert.Equal(t, 400, same.Status, "not a fingerprint_mismatch of the same input: %s", same.Raw)
}
