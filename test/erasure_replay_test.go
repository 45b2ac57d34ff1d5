package test

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestErasureReplay_restoredBackup drives SPEC §14's backups through the
// real binaries on SQLite and PostgreSQL: ledger A erases by key, by
// subject and one field in another namespace, after a backup B was taken;
// `ledgerctl erasures export` (from --server with an admin token, and from
// --db, the same document) lists them; `ledgerctl erase --replay` into B
// erases the same values — a tampered hash skipped, then erased by the
// true file, a seq B never had skipped as absent, a second replay a no-op,
// a bad file refused with nothing changed — and B's payload rows and
// (SQLite) files no longer hold the erased values, its subject rows are
// gone, and `ledgerctl verify --db B` is clean.
func TestErasureReplay_restoredBackup(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, testErasureReplay)
}

func testErasureReplay(t *testing.T, dbA string) {
	gone, kept := randomMarker(t), randomMarker(t)
	l := startLedgerdEnv(t, nil, dbA, "--default-payloads", "committed")
	require.Equal(t, 201, l.Do("POST", "/v1/namespaces", `{"name":"people","payloads":"committed"}`).Status)
	write := func(prefix, key, subjects, value, ref string) {
		rr := l.Do("POST", prefix+"/effects/reserve", `{"idempotency_key":"`+key+`","execution_id":"e1","tool":"mail.send","effect":"external","input":{"k":"`+key+`"}`+subjects+`}`)
		require.Equal(t, 201, rr.Status, rr.Raw)
		c := l.Do("POST", prefix+"/effects/"+key+"/commit", `{"reservation":"`+rr.Body["reservation"].(string)+
			`","outcome":"succeeded","external_ref":"ref-`+ref+`","result":{"to":"`+value+`"}}`)
		require.Equal(t, 201, c.Status, c.Raw)
	}
	write("/v1", "keep-0000001", "", kept, kept)
	write("/v1", "drop-0000001", "", gone, gone)
	write("/v1", "subj-0000001", `,"subjects":["person-`+gone+`"]`, gone, gone)
	write("/v1", "subj-0000002", `,"subjects":["person-`+gone+`","other"]`, gone, gone)
	write("/v1/ns/people", "ppl-0000001", "", gone, kept) // only its result is erased
	open := l.Do("POST", "/v1/effects/reserve", `{"idempotency_key":"open-0000001","execution_id":"e1","tool":"mail.send","effect":"external","lease_ms":86400000,"subjects":["person-`+gone+`"]}`)
	require.Equal(t, 201, open.Status, open.Raw) // in flight when the subject is erased: pending
	require.NoError(t, l.Stop())

	// The backup, taken before any erasure; then the tokens of A.
	dbB := backupLedger(t, dbA)
	admin := createToken(t, dbA, "ops", "admin")
	reader := createToken(t, dbA, "auditor", "reader")

	l = startLedgerdEnv(t, nil, dbA, "--default-payloads", "committed")
	auth := []string{"Authorization", "Bearer " + admin}
	write = func(prefix, key, subjects, value, ref string) {
		rr := l.Do("POST", prefix+"/effects/reserve", `{"idempotency_key":"`+key+`","execution_id":"e1","tool":"mail.send","effect":"external","input":{"k":"`+key+`"}`+subjects+`}`, auth...)
		require.Equal(t, 201, rr.Status, rr.Raw)
		c := l.Do("POST", prefix+"/effects/"+key+"/commit", `{"reservation":"`+rr.Body["reservation"].(string)+
			`","outcome":"succeeded","external_ref":"ref-`+ref+`","result":{"to":"`+value+`"}}`, auth...)
		require.Equal(t, 201, c.Status, c.Raw)
	}
	write("/v1", "late-0000001", "", gone, gone) // after the backup: B never had it
	for _, body := range []string{`{"keys":["drop-0000001"],"reason":"request 1"}`, `{"subject":"person-` + gone + `"}`,
		`{"keys":["late-0000001"]}`} {
		er := l.Do("POST", "/v1/erasures", body, auth...)
		require.Equal(t, 201, er.Status, er.Raw)
	}
	er := l.Do("POST", "/v1/ns/people/erasures", `{"keys":["ppl-0000001"],"fields":["result"]}`, auth...)
	require.Equal(t, 201, er.Status, er.Raw)

	// The listing is an admin's.
	assert.Equal(t, 401, l.Do("GET", "/v1/erasures", "").Status)
	assert.Equal(t, 403, l.Do("GET", "/v1/erasures", "", "Authorization", "Bearer "+reader).Status)
	_, stderr, code := ledgerctl(t, "erasures", "export", "--server", l.URL, "--token", reader)
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "forbidden")
	fromServer, stderr, code := ledgerctl(t, "erasures", "export", "--server", l.URL, "--token", admin)
	require.Equal(t, 0, code, stderr)
	require.NoError(t, l.Stop())
	dir := t.TempDir()
	file := filepath.Join(dir, "erasures.json")
	_, stderr, code = ledgerctl(t, "erasures", "export", "--db", dbA, "--out", file)
	require.Equal(t, 0, code, stderr)
	raw, err := os.ReadFile(file)
	require.NoError(t, err)
	assert.Equal(t, withoutExportTime(t, fromServer), withoutExportTime(t, string(raw)), "--db and --server export the same")
	assert.NotContains(t, string(raw), gone, "the file holds no value")
	var doc struct {
		Format     string `json:"format"`
		Namespaces []struct {
			Namespace string `json:"namespace"`
			Erasures  []struct {
				Seq      uint64   `json:"seq"`
				Subjects []string `json:"subjects"`
				Erased   []struct {
					Seq    uint64   `json:"seq"`
					Hash   string   `json:"hash"`
					Fields []string `json:"fields"`
				} `json:"erased"`
			} `json:"erasures"`
			Pending []struct {
				Key string `json:"key"`
			} `json:"pending"`
		} `json:"namespaces"`
	}
	require.NoError(t, json.Unmarshal(raw, &doc))
	assert.Equal(t, "effect-ledger/erasures/v1", doc.Format)
	require.Len(t, doc.Namespaces, 2, string(raw))
	def, ppl := doc.Namespaces[0], doc.Namespaces[1]
	require.Equal(t, "default", def.Namespace)
	require.Len(t, def.Erasures, 3, string(raw))
	assert.Empty(t, def.Erasures[0].Subjects)
	assert.Len(t, def.Erasures[1].Subjects, 1, "the erased subject's MAC")
	assert.Len(t, def.Erasures[1].Erased, 2, "the two keys' commits")
	require.Len(t, def.Pending, 1, string(raw))
	assert.Equal(t, "open-0000001", def.Pending[0].Key)
	require.Len(t, ppl.Erasures, 1)
	assert.Equal(t, []string{"result"}, ppl.Erasures[0].Erased[0].Fields)
	verified(t, dbA)

	// B, as restored, still holds the values and the subject's rows.
	require.Positive(t, payloadsHolding(t, dbB, gone))
	require.Equal(t, 4, subjectRows(t, dbB))

	// A tampered hash is skipped; the rest is erased.
	tampered := filepath.Join(dir, "tampered.json")
	victim := def.Erasures[1].Erased[0]
	require.NoError(t, os.WriteFile(tampered, bytes.Replace(raw, []byte(victim.Hash), []byte(strings.Repeat("0", 64)), 1), 0o600))
	out, stderr, code := ledgerctl(t, "erase", "--replay", tampered, "--db", dbB, "--json")
	require.Equal(t, 0, code, stderr)
	var res struct {
		Namespaces []struct {
			Namespace string `json:"namespace"`
			Receipts  []struct {
				Seq     uint64 `json:"seq"`
				Replays uint64 `json:"replays"`
			} `json:"receipts"`
			Count   uint64 `json:"count"`
			Skipped []struct {
				Erasure uint64 `json:"erasure"`
				Seq     uint64 `json:"seq"`
				Reason  string `json:"reason"`
			} `json:"skipped"`
			Pending []struct {
				Key    string `json:"key"`
				Status string `json:"status"`
			} `json:"pending"`
			Purged *bool `json:"purged"`
		} `json:"namespaces"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Len(t, res.Namespaces, 2, out)
	d := res.Namespaces[0]
	assert.Len(t, d.Receipts, 2, "the key's erasure and the subject's: %s", out)
	assert.Equal(t, uint64(1+1), d.Count, out)
	reasons := map[uint64]string{}
	for _, s := range d.Skipped {
		reasons[s.Seq] = s.Reason
	}
	assert.Equal(t, "hash_mismatch", reasons[victim.Seq], out)
	require.Len(t, d.Pending, 1, out)
	assert.Equal(t, "marked", d.Pending[0].Status, "open-0000001 is in flight in B too: %s", out)
	for _, x := range def.Erasures[2].Erased {
		assert.Equal(t, "absent", reasons[x.Seq], "late-0000001 is not in the backup: %s", out)
	}
	if !strings.HasPrefix(dbB, "postgres") {
		require.NotNil(t, d.Purged, out)
		assert.True(t, *d.Purged, out)
	}
	assert.Equal(t, 1, subjectRows(t, dbB), "the subject's index rows are gone, the other subject's row stays (as in A)")
	assert.Positive(t, payloadsHolding(t, dbB, gone), "the skipped seq keeps its value")

	// The true file erases the skipped seq; a second replay changes nothing.
	out, stderr, code = ledgerctl(t, "erase", "--replay", file, "--db", dbB)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "default: erased the payloads of 1 receipt\n", out)
	assert.Contains(t, out, "people: nothing to erase\n", out)
	headB := headOf(t, dbB)
	out, stderr, code = ledgerctl(t, "erase", "--replay", file, "--db", dbB)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "default: nothing to erase\n", out)
	assert.Equal(t, headB, headOf(t, dbB), "a second replay appends nothing")

	// A bad file is refused and changes nothing.
	bad := filepath.Join(dir, "bad.json")
	for _, text := range []string{`{`, `{"format":"effect-ledger/erasures/v2","exported_at":1,"namespaces":[]}`,
		strings.Replace(string(raw), `"fields": [`, `"fields": ["colour",`, 1)} {
		require.NoError(t, os.WriteFile(bad, []byte(text), 0o600))
		_, stderr, code = ledgerctl(t, "erase", "--replay", bad, "--db", dbB)
		assert.Equal(t, 2, code)
		assert.Contains(t, stderr, "bad erasures file")
		assert.Contains(t, stderr, "nothing was changed")
	}
	assert.Equal(t, headB, headOf(t, dbB))

	assert.Zero(t, payloadsHolding(t, dbB, gone), "no payload row of B holds an erased value")
	assert.Positive(t, payloadsHolding(t, dbB, kept), "the values never erased stay")
	if !strings.HasPrefix(dbB, "postgres") {
		assert.Empty(t, filesHolding(t, filepath.Dir(dbB), gone), "no file of B holds an erased value")
	}
	verified(t, dbB)
	b := StartLedgerd(t, dbB)
	k := b.Do("GET", "/v1/effects/subj-0000002", "")
	require.Equal(t, 200, k.Status, k.Raw)
	assert.NotContains(t, k.Raw, gone)
	assert.Contains(t, k.Raw, `"erased":{"external_ref":`)

	// The key marked pending in B is erased as it finishes there.
	c := b.Do("POST", "/v1/effects/open-0000001/commit", `{"reservation":"`+open.Body["reservation"].(string)+
		`","outcome":"succeeded","result":{"to":"`+gone+`"}}`)
	require.Equal(t, 201, c.Status, c.Raw)
	k = b.Do("GET", "/v1/effects/open-0000001", "")
	require.Equal(t, 200, k.Status, k.Raw)
	assert.NotContains(t, k.Raw, gone, "the pending mark replayed into B erased the outcome")
	require.NoError(t, b.Stop())
	verified(t, dbB)
}

// backupLedger copies the stopped ledger db as a backup would and returns
// the copy: SQLite with `ledgerctl backup` into a directory of its own,
// PostgreSQL as a new database made from db as its template.
func backupLedger(t *testing.T, db string) string {
	t.Helper()
	if !strings.HasPrefix(db, "postgres") {
		out := filepath.Join(t.TempDir(), "restored.db")
		_, stderr, code := ledgerctl(t, "backup", "--db", db, "--out", out)
		require.Equal(t, 0, code, stderr)
		return out
	}
	u, err := url.Parse(db)
	require.NoError(t, err)
	from := strings.TrimPrefix(u.Path, "/")
	var b [8]byte
	_, err = rand.Read(b[:])
	require.NoError(t, err)
	name := "t_" + hex.EncodeToString(b[:])
	admin := *u
	admin.Path = "/postgres"
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, admin.String())
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE "+from)
	require.NoError(t, err)
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), admin.String())
		if err == nil {
			_, _ = conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			_ = conn.Close(context.Background())
		}
	})
	u.Path = "/" + name
	return u.String()
}

// withoutExportTime is an erasures document without its exported_at.
func withoutExportTime(t *testing.T, doc string) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(doc), &m), doc)
	delete(m, "exported_at")
	return m
}

// payloadsHolding counts the payload rows of db, every namespace, that
// hold value in one of their four fields.
func payloadsHolding(t *testing.T, db, value string) int {
	t.Helper()
	return countRows(t, db,
		`SELECT count(*) FROM payloads WHERE position($1 in coalesce(external_ref, '') || coalesce(result, '') || coalesce(error_message, '') || coalesce(note, '')) > 0`,
		`SELECT count(*) FROM ns_payloads WHERE instr(coalesce(external_ref, '') || coalesce(result, '') || coalesce(error_message, '') || coalesce(note, ''), ?) > 0`,
		value)
}

// subjectRows counts the subject index rows of db's default namespace.
func subjectRows(t *testing.T, db string) int {
	t.Helper()
	return countRows(t, db, `SELECT count(*) FROM subjects WHERE namespace = 'default'`, `SELECT count(*) FROM ns_subjects WHERE ns = 0`)
}

// headOf is the head seq of db's default namespace.
func headOf(t *testing.T, db string) int {
	t.Helper()
	return countRows(t, db, `SELECT seq FROM head WHERE namespace = 'default'`, `SELECT coalesce(max(seq), 0) FROM ns_receipts WHERE ns = 0`)
}

// countRows runs the PostgreSQL or the SQLite query, by db's kind, and
// returns its one integer.
func countRows(t *testing.T, db, pgQuery, sqliteQuery string, args ...any) int {
	t.Helper()
	var n int
	if strings.HasPrefix(db, "postgres") {
		conn, err := pgx.Connect(context.Background(), db)
		require.NoError(t, err)
		defer conn.Close(context.Background())
		require.NoError(t, conn.QueryRow(context.Background(), pgQuery, args...).Scan(&n), pgQuery)
		return n
	}
	sdb, err := sql.Open("sqlite3", "file:"+db+"?mode=ro")
	require.NoError(t, err)
	defer sdb.Close()
	require.NoError(t, sdb.QueryRow(sqliteQuery, args...).Scan(&n), sqliteQuery)
	return n
}

// filesHolding lists the files under dir that contain value.
func filesHolding(t *testing.T, dir, value string) []string {
	t.Helper()
	var where []string
	require.NoError(t, filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err == nil && bytes.Contains(b, []byte(value)) {
			where = append(where, path+fmt.Sprintf(" (%d bytes)", len(b)))
		}
		return nil
	}))
	return where
}
