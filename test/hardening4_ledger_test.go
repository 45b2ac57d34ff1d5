package test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
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
	r := l.Do("POST", "/v1/effects/reserve", reserve(key, "exec-1", 1, false))
	require.Equal(t, 201, r.Status, r.Raw)
	c := l.Do("POST", "/v1/effects/"+key+"/commit", `{"reservation":"`+r.Body["reservation"].(string)+
		`","outcome":"succeeded","external_ref":"re_3Pq9","result":`+integrityResult+`}`)
	require.Equal(t, 201, c.Status, c.Raw)
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
	require.NoError(t, sdb.QueryRow(`SELECT sql FROM sqlite_master WHERE name = 'receipts_no_update'`).Scan(&trigger))
	for _, q := range []string{`DROP TRIGGER receipts_no_update`, `UPDATE receipts SET result = ?, hash = ? WHERE seq = ?`, trigger} {
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
	if rehash && !follows && !strings.HasPrefix(db, "postgres") {
		t.Skip("a SQLite file whose last receipt's hash changed does not open (its head row disagrees: derived state)")
	}
	l := StartLedgerd(t, db)
	const key = "refund-order-1234"
	rc := commitRefund(t, l, key)
	if follows {
		ok := l.Do("POST", "/v1/effects/reserve", reserve(key, "exec-2", 1, false))
		require.Equal(t, 200, ok.Status, "an intact result replays: %s", ok.Raw)
	}
	require.NoError(t, l.Stop())

	tampered := strings.Replace(integrityResult, "1200", "9200", 1)
	var hash *chain.Hash
	if rehash {
		forged := rc
		forged.Result = tampered
		h := forged.ComputeHash(rc.PrevHash)
		hash = &h
	}
	tamperResult(t, db, rc.Seq, tampered, hash)

	l = StartLedgerd(t, db)
	require.Equal(t, 200, l.Do("GET", "/readyz", "").Status, "nothing read the receipt yet")
	head := l.Do("GET", "/v1/head", "")
	for _, r := range []Resp{
		l.Do("POST", "/v1/effects/reserve", reserve(key, "exec-3", 1, false)),
		l.Do("GET", "/v1/effects/"+key, ""),
	} {
		assert.Equal(t, 500, r.Status, r.Raw)
		assert.Equal(t, "integrity_error", r.Code(), r.Raw)
		assert.NotContains(t, r.Raw, "9200", "the tampered value is never served")
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
	assert.NotContains(t, l.Logs(), "9200", "the log never carries the value")
}
