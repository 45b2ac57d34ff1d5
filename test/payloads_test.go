package test

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// TestCommitted_chainHoldsCommitments drives SPEC §14's committed payloads
// through the real binaries on SQLite and PostgreSQL: namespaces created
// with each mode, the chain (read with SQL) holding pc1: commitments and
// never the values, the API answering with the values, their commitments
// and salts (receipts, keys, replays, refusals), `ledgerctl verify --db`
// clean, and a value changed in storage found by verify and refused by
// ledgerd.
func TestCommitted_chainHoldsCommitments(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, testCommitted)
}

func testCommitted(t *testing.T, db string) {
	marker := randomMarker(t)
	l := startLedgerdEnv(t, nil, db, "--default-payloads", "committed")

	// Modes: the default namespace is committed, others as asked.
	for _, c := range []struct{ body, want string }{
		{`{"name":"plain","payloads":"inline"}`, "inline"},
		{`{"name":"people","payloads":"committed"}`, "committed"},
	} {
		r := l.Do("POST", "/v1/namespaces", c.body)
		require.Equal(t, 201, r.Status, r.Raw)
		assert.Equal(t, c.want, r.Body["payloads"])
	}
	r := l.Do("POST", "/v1/namespaces", `{"name":"bad","payloads":"sealed"}`)
	require.Equal(t, 400, r.Status, r.Raw)
	assert.Equal(t, "payloads", r.Body["error"].(map[string]any)["details"].(map[string]any)["field"])
	r = l.Do("GET", "/v1/namespaces", "")
	require.Equal(t, 200, r.Status, r.Raw)
	modes := map[string]any{}
	for _, n := range r.Body["namespaces"].([]any) {
		m := n.(map[string]any)
		modes[m["name"].(string)] = m["payloads"]
	}
	assert.Equal(t, map[string]any{"default": "committed", "plain": "inline", "people": "committed"}, modes)

	// The fingerprint key: input_hash is keyed in a committed namespace.
	dk := l.Do("GET", "/v1/derivation-key", "")
	require.Equal(t, 200, dk.Status, dk.Raw)
	assert.Equal(t, "committed", dk.Body["payloads"])
	key, err := hex.DecodeString(dk.Body["key"].(string))
	require.NoError(t, err)
	require.Len(t, key, 32)
	plainKey := l.Do("GET", "/v1/ns/plain/derivation-key", "")
	require.Equal(t, 200, plainKey.Status, plainKey.Raw)
	assert.Equal(t, "inline", plainKey.Body["payloads"])
	assert.NotEqual(t, dk.Body["key"], plainKey.Body["key"], "each namespace has its own")

	result := `{"to":"` + marker + `"}`
	for _, ns := range []string{"", "plain"} {
		prefix := "/v1"
		if ns != "" {
			prefix = "/v1/ns/" + ns
		}
		// A success with a result and a reference, then its replay.
		body := `{"idempotency_key":"mail-0000001","execution_id":"e1","tool":"email.send","effect":"external","input":{"to":"x"}}`
		rr := l.Do("POST", prefix+"/effects/reserve", body)
		require.Equal(t, 201, rr.Status, rr.Raw)
		c := l.Do("POST", prefix+"/effects/mail-0000001/commit", `{"reservation":"`+rr.Body["reservation"].(string)+
			`","outcome":"succeeded","external_ref":"ref-`+marker+`","result":`+result+`}`)
		require.Equal(t, 201, c.Status, c.Raw)
		rp := l.Do("POST", prefix+"/effects/reserve", strings.Replace(body, `"e1"`, `"e2"`, 1))
		require.Equal(t, 200, rp.Status, rp.Raw)
		assert.Equal(t, "ref-"+marker, rp.Body["external_ref"], "the replay answers the value")
		assert.Equal(t, map[string]any{"to": marker}, rp.Body["result"])

		// A failure whose message a refusal quotes.
		f := `{"idempotency_key":"mail-0000002","execution_id":"e1","tool":"email.send","effect":"external","input":{"to":"y"}}`
		rr = l.Do("POST", prefix+"/effects/reserve", f)
		require.Equal(t, 201, rr.Status, rr.Raw)
		c = l.Do("POST", prefix+"/effects/mail-0000002/commit", `{"reservation":"`+rr.Body["reservation"].(string)+
			`","outcome":"failed","error":{"code":"BOUNCED","message":"no mailbox `+marker+`","retryable":false}}`)
		require.Equal(t, 201, c.Status, c.Raw)
		refused := l.Do("POST", prefix+"/effects/reserve", strings.Replace(f, `"e1"`, `"e2"`, 1))
		require.Equal(t, 409, refused.Status, refused.Raw)
		assert.Contains(t, refused.Raw, "no mailbox "+marker, "the refusal quotes the value")

		// The key's receipts show the values, with commitments and salts in a committed namespace.
		k := l.Do("GET", prefix+"/effects/mail-0000001", "")
		require.Equal(t, 200, k.Status, k.Raw)
		fp, err := ledger.Fingerprint([]byte(`{"to":"x"}`))
		require.NoError(t, err)
		if ns == "" {
			fp = ledger.KeyedHash(key, fp)
			assert.True(t, strings.HasPrefix(fp, "hk1:"), fp)
		}
		assert.Equal(t, fp, k.Body["input_hash"], "the input_hash recorded")
		var commit map[string]any
		for _, rc := range k.Body["receipts"].([]any) {
			if m := rc.(map[string]any); m["kind"] == "commit" {
				commit = m
			}
		}
		require.NotNil(t, commit, k.Raw)
		assert.Equal(t, "ref-"+marker, commit["external_ref"])
		assert.Equal(t, result, commit["result_text"])
		if ns == "" {
			commitments := commit["commitments"].(map[string]any)
			salts := commit["salts"].(map[string]any)
			for _, f := range []string{"external_ref", "result"} {
				assert.True(t, chain.IsCommitment(commitments[f].(string)), "%s: %v", f, commitments)
				assert.Len(t, salts[f], 32, f)
			}
			// The salt opens the commitment: a reader can check the value.
			salt, err := chain.ParseSalt(salts["result"].(string))
			require.NoError(t, err)
			assert.Equal(t, commitments["result"], chain.Commit(chain.FieldResult, salt, result))
		} else {
			assert.NotContains(t, commit, "commitments", "an inline namespace shows the chain as it is")
		}
	}

	// The chain holds commitments, never the values; the inline namespace the values.
	chainTexts := readChainTexts(t, db)
	for ns, texts := range chainTexts {
		for _, s := range texts {
			if ns == "plain" {
				continue
			}
			assert.NotContains(t, s, marker, "namespace %s: a value on the chain", ns)
		}
	}
	assert.Contains(t, strings.Join(chainTexts["plain"], " "), marker)
	assert.Contains(t, strings.Join(chainTexts["default"], " "), chain.CommitmentPrefix)

	serverExport, stderr, code := ledgerctl(t, "export", "--server", l.URL)
	require.Equal(t, 0, code, stderr)
	require.NoError(t, l.Stop())
	for _, ns := range []string{"default", "plain"} {
		out, stderr, code := ledgerctl(t, "verify", "--db", db, "--namespace", ns)
		require.Equal(t, 0, code, "verify %s: %s%s", ns, out, stderr)
	}
	// Read from the file, ledgerctl shows the values as the API does.
	fileExport, stderr, code := ledgerctl(t, "export", "--db", db)
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, serverExport, fileExport, "the file and the server export the same receipts, with their values")
	assert.Contains(t, fileExport, `"external_ref":"ref-`+marker+`"`)
	shown, stderr, code := ledgerctl(t, "show", "--db", db, "mail-0000001")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, shown, "ref=ref-"+marker, "the value, not its commitment")
	listed, stderr, code := ledgerctl(t, "receipts", "--db", db, "--json")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, listed, `"result_text":"{\"to\":\"`+marker)

	// Erase by keys (SPEC §14): the values go, one erase receipt, proofs stay.
	l = startLedgerdEnv(t, nil, db)
	for _, bad := range []struct{ body, field string }{
		{`{}`, "keys"}, {`{"keys":["mail-0000001"],"subject":"c-1"}`, "keys"}, {`{"keys":["mail-0000001"],"fields":["tool"]}`, "fields"},
		{`{"keys":[]}`, "keys"}, {`{"keys":["x"]}`, "idempotency_key"},
	} {
		r := l.Do("POST", "/v1/erasures", bad.body)
		require.Equal(t, 400, r.Status, "%s: %s", bad.body, r.Raw)
	}
	r = l.Do("POST", "/v1/ns/plain/erasures", `{"keys":["mail-0000001"]}`)
	require.Equal(t, 409, r.Status, r.Raw)
	assert.Equal(t, "payloads_inline", r.Code())
	r = l.Do("POST", "/v1/erasures", `{"keys":["no-such-key-01"]}`)
	require.Equal(t, 200, r.Status, r.Raw)
	assert.Equal(t, "nothing_to_erase", r.Body["status"])
	er := l.Do("POST", "/v1/erasures", `{"keys":["mail-0000001","mail-0000002"],"reason":"GDPR request 17"}`)
	require.Equal(t, 201, er.Status, er.Raw)
	assert.Equal(t, "erased", er.Body["status"])
	assert.Equal(t, float64(2), er.Body["count"], er.Raw)
	eraseSeq := uint64(er.Body["receipt"].(map[string]any)["seq"].(float64))
	ge := l.Do("GET", fmt.Sprintf("/v1/erasures/%d", eraseSeq), "")
	require.Equal(t, 200, ge.Status, ge.Raw)
	assert.Equal(t, []any{"external_ref", "result", "error_message", "note"}, ge.Body["fields"])
	assert.Contains(t, ge.Body, "ranges", "an admin (no tokens) sees the ranges")
	if strings.HasPrefix(db, "postgres") {
		assert.Nil(t, ge.Body["purged"], "PostgreSQL cannot tell")
	}
	require.Equal(t, 404, l.Do("GET", "/v1/erasures/1", "").Status, "not an erase receipt")
	// The replay still replays, without the value, naming the erase.
	rp := l.Do("POST", "/v1/effects/reserve", `{"idempotency_key":"mail-0000001","execution_id":"e3","tool":"email.send","effect":"external","input":{"to":"x"}}`)
	require.Equal(t, 200, rp.Status, rp.Raw)
	assert.Equal(t, "true", rp.Header.Get("Idempotent-Replayed"))
	assert.Nil(t, rp.Body["result"])
	assert.Equal(t, "", rp.Body["external_ref"])
	assert.Equal(t, map[string]any{"external_ref": float64(eraseSeq), "result": float64(eraseSeq)}, rp.Body["erased"])
	k := l.Do("GET", "/v1/effects/mail-0000002?history=true", "")
	require.Equal(t, 200, k.Status, k.Raw)
	assert.NotContains(t, k.Raw, marker, "no answer shows an erased value")
	assert.Contains(t, k.Raw, `"erased":{"error_message":`)
	// Subjects (SPEC §14): validated, never on the chain, erased by subject.
	for _, subj := range []string{`["a","b","c","d","e","f","g","h","i"]`, `[""]`, `["` + strings.Repeat("s", 129) + `"]`, `[1]`, `"c-1"`} {
		r := l.Do("POST", "/v1/effects/reserve", `{"idempotency_key":"mail-0000004","execution_id":"e1","tool":"email.send","effect":"external","input":{"to":"w"},"subjects":`+subj+`}`)
		require.Equal(t, 400, r.Status, "%s: %s", subj, r.Raw)
		assert.Equal(t, "subjects", r.Body["error"].(map[string]any)["details"].(map[string]any)["field"], r.Raw)
		assert.NotContains(t, r.Raw, strings.Repeat("s", 129), "the refusal never quotes a subject")
	}
	subject := "customer-" + marker
	rr0 := l.Do("POST", "/v1/effects/reserve", `{"idempotency_key":"mail-0000004","execution_id":"e1","tool":"email.send","effect":"external","input":{"to":"w"},"subjects":["`+subject+`","team-7"]}`)
	require.Equal(t, 201, rr0.Status, rr0.Raw)
	l.Commit(t, "mail-0000004", `{"reservation":"`+rr0.Body["reservation"].(string)+`","outcome":"succeeded","result":`+result+`}`)
	es := l.Do("POST", "/v1/erasures", `{"subject":"`+subject+`"}`)
	require.Equal(t, 201, es.Status, es.Raw)
	assert.Equal(t, float64(1), es.Body["count"], es.Raw)
	k4 := l.Do("GET", "/v1/effects/mail-0000004", "")
	assert.NotContains(t, k4.Raw, marker)
	assert.Contains(t, k4.Raw, `"erased":{"result":`)
	again := l.Do("POST", "/v1/erasures", `{"subject":"`+subject+`"}`)
	require.Equal(t, 200, again.Status, again.Raw)
	assert.Equal(t, "nothing_to_erase", again.Body["status"], "the subject's index rows went with the erasure")

	// A key in flight is marked: the commit that finalizes it is erased in its transaction.
	rr5 := l.Do("POST", "/v1/effects/reserve", `{"idempotency_key":"mail-0000005","execution_id":"e1","tool":"email.send","effect":"external","input":{"to":"v"}}`)
	require.Equal(t, 201, rr5.Status, rr5.Raw)
	ep := l.Do("POST", "/v1/erasures", `{"keys":["mail-0000005"]}`)
	require.Equal(t, 200, ep.Status, ep.Raw)
	assert.Equal(t, "nothing_to_erase", ep.Body["status"])
	assert.Equal(t, []any{"mail-0000005"}, ep.Body["pending"])
	c5 := l.Commit(t, "mail-0000005", `{"reservation":"`+rr5.Body["reservation"].(string)+`","outcome":"succeeded","external_ref":"ref-`+marker+`","result":`+result+`}`)
	k5 := l.Do("GET", "/v1/effects/mail-0000005", "")
	assert.NotContains(t, k5.Raw, marker, "the commit of a pending key keeps no value")
	assert.Contains(t, k5.Raw, `"erased":{"external_ref":`)
	commitSeq := c5.Body["receipt"].(map[string]any)["seq"].(float64)
	follow := l.Do("GET", fmt.Sprintf("/v1/erasures/%d", int(commitSeq)+1), "")
	require.Equal(t, 200, follow.Status, "an erase receipt follows the commit: %s", follow.Raw)
	assert.Equal(t, []any{[]any{commitSeq, commitSeq}}, follow.Body["ranges"])

	// A key committed after the erasure keeps its values.
	rr := l.Do("POST", "/v1/effects/reserve", `{"idempotency_key":"mail-0000003","execution_id":"e1","tool":"email.send","effect":"external","input":{"to":"z"}}`)
	require.Equal(t, 201, rr.Status, rr.Raw)
	l.Commit(t, "mail-0000003", `{"reservation":"`+rr.Body["reservation"].(string)+`","outcome":"succeeded","result":`+result+`}`)
	require.NoError(t, l.Stop())
	out, stderr, code := ledgerctl(t, "verify", "--db", db)
	require.Equal(t, 0, code, "verify after the erasure: %s%s", out, stderr)
	out, stderr, code = ledgerctl(t, "audit", "--db", db, "--json")
	require.Equal(t, 0, code, stderr)
	var audit struct {
		Erasures []struct {
			Seq    uint64   `json:"seq"`
			Count  uint64   `json:"count"`
			Fields []string `json:"fields"`
			Reason string   `json:"reason"`
		} `json:"erasures"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &audit), out)
	require.NotEmpty(t, audit.Erasures, out)
	assert.Equal(t, eraseSeq, audit.Erasures[0].Seq)
	assert.Equal(t, uint64(2), audit.Erasures[0].Count)
	assert.Equal(t, "GDPR request 17", audit.Erasures[0].Reason, "the audit shows the reason")
	assert.NotContains(t, out, marker, "the audit shows no erased value")

	// A value changed beside the chain: verify names the rule, ledgerd refuses to serve it.
	tamperPayload(t, db, `{"to":"someone else"}`, "mail-0000003")
	out, stderr, code = ledgerctl(t, "verify", "--db", db, "--json")
	require.Equal(t, 1, code, "%s%s", out, stderr)
	assert.Contains(t, out, `"payload_mismatch"`)
	assert.NotContains(t, out, "someone else", "a verifier never quotes a value")
	l = startLedgerdEnv(t, nil, db)
	g := l.Do("GET", "/v1/effects/mail-0000003", "")
	require.Equal(t, 500, g.Status, g.Raw)
	assert.Equal(t, "integrity_error", g.Code())
	assert.NotContains(t, g.Raw, "someone else")
	assert.NotContains(t, l.Logs(), "someone else")
}

// randomMarker is 32 random hex digits, to find a value in files and answers.
func randomMarker(t *testing.T) string {
	var b [16]byte
	_, err := rand.Read(b[:])
	require.NoError(t, err)
	return hex.EncodeToString(b[:])
}

// readChainTexts reads the four payload fields of every receipt, by
// namespace, straight from the receipts table.
func readChainTexts(t *testing.T, db string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	const cols = `external_ref || ' ' || result || ' ' || error_message || ' ' || note`
	if strings.HasPrefix(db, "postgres") {
		conn, err := pgx.Connect(context.Background(), db)
		require.NoError(t, err)
		defer conn.Close(context.Background())
		rows, err := conn.Query(context.Background(), `SELECT namespace, `+cols+` FROM receipts ORDER BY namespace, seq`)
		require.NoError(t, err)
		defer rows.Close()
		for rows.Next() {
			var ns, s string
			require.NoError(t, rows.Scan(&ns, &s))
			out[ns] = append(out[ns], s)
		}
		require.NoError(t, rows.Err())
		return out
	}
	sdb, err := sql.Open("sqlite3", "file:"+db+"?mode=ro")
	require.NoError(t, err)
	defer sdb.Close()
	rows, err := sdb.Query(`SELECT coalesce(n.name, 'default'), ` + cols + ` FROM ns_receipts AS r
		LEFT JOIN namespaces AS n ON n.id = r.ns ORDER BY r.ns, r.seq`)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var ns, s string
		require.NoError(t, rows.Scan(&ns, &s))
		out[ns] = append(out[ns], s)
	}
	require.NoError(t, rows.Err())
	return out
}

// tamperPayload sets the kept result of key's commit in the default
// namespace to value, past the table's guard.
func tamperPayload(t *testing.T, db, value, key string) {
	t.Helper()
	if strings.HasPrefix(db, "postgres") {
		conn, err := pgx.Connect(context.Background(), db)
		require.NoError(t, err)
		defer conn.Close(context.Background())
		for _, q := range []string{`ALTER TABLE payloads DISABLE TRIGGER USER`,
			`UPDATE payloads SET result = $1 WHERE namespace = 'default' AND seq = (SELECT seq FROM receipts WHERE namespace = 'default' AND kind = 'commit' AND idempotency_key = $2)`,
			`ALTER TABLE payloads ENABLE TRIGGER USER`} {
			var args []any
			if strings.HasPrefix(q, "UPDATE") {
				args = []any{value, key}
			}
			_, err := conn.Exec(context.Background(), q, args...)
			require.NoError(t, err, q)
		}
		return
	}
	sdb, err := sql.Open("sqlite3", "file:"+db)
	require.NoError(t, err)
	defer sdb.Close()
	var trigger string
	require.NoError(t, sdb.QueryRow(`SELECT sql FROM sqlite_master WHERE name = 'ns_payloads_erase_only'`).Scan(&trigger))
	for _, q := range []string{`DROP TRIGGER ns_payloads_erase_only`,
		`UPDATE ns_payloads SET result = ? WHERE rid = (SELECT rowid FROM ns_receipts WHERE ns = 0 AND kind = 'commit' AND idempotency_key = ?)`,
		trigger} {
		var args []any
		if strings.HasPrefix(q, "UPDATE") {
			args = []any{value, key}
		}
		_, err := sdb.Exec(q, args...)
		require.NoError(t, err, q)
	}
}

// TestErasure_goneFromFiles (SPEC §14, "gone means gone"): a random marker
// in every payload field of a committed namespace (and in the subject the
// reserves name, which only its MAC reaches) is found in the ledger's files
// first, then erased by subject; once the erasure reports purged, no byte of it
// is left in the ledger file, its WAL and shared memory, the key index, or
// ledgerd's log — nor after a clean stop.
func TestErasure_goneFromFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	marker := randomMarker(t)
	l := startLedgerdEnv(t, nil, db, "--default-payloads", "committed")
	// Values large enough to overflow a page, and enough rows to split some.
	big := strings.Repeat(marker, 200)
	for i := range 40 {
		key := fmt.Sprintf("gone-%08d", i)
		rr := l.Do("POST", "/v1/effects/reserve", `{"idempotency_key":"`+key+`","execution_id":"e1","tool":"mail.send","effect":"external","input":{"i":`+fmt.Sprint(i)+`},"subjects":["person-`+marker+`"]}`)
		require.Equal(t, 201, rr.Status, rr.Raw)
		body := `{"reservation":"` + rr.Body["reservation"].(string) + `","outcome":"succeeded","external_ref":"ref-` + marker + `","result":{"to":"` + big + `"}}`
		if i%2 == 1 {
			body = `{"reservation":"` + rr.Body["reservation"].(string) + `","outcome":"failed","error":{"code":"BOUNCED","message":"no mailbox ` + marker + `"}}`
		}
		l.Commit(t, key, body)
	}
	found := func() []string {
		var where []string
		_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return nil
			}
			b, err := os.ReadFile(path)
			if err == nil && bytes.Contains(b, []byte(marker)) {
				where = append(where, path)
			}
			return nil
		})
		return where
	}
	require.NotEmpty(t, found(), "the test can fail: the values are in the files before the erasure")

	er := l.Do("POST", "/v1/erasures", `{"subject":"person-`+marker+`"}`)
	require.Equal(t, 201, er.Status, er.Raw)
	assert.Equal(t, false, er.Body["purged"])
	assert.Equal(t, float64(40), er.Body["count"], "every generation the subject named")
	seq := int(er.Body["receipt"].(map[string]any)["seq"].(float64))
	require.Eventually(t, func() bool {
		return l.Do("GET", fmt.Sprintf("/v1/erasures/%d", seq), "").Body["purged"] == true
	}, 30*time.Second, 50*time.Millisecond, "the erasure is purged: %s", l.Logs())
	assert.Empty(t, found(), "once purged, no file holds an erased value")
	assert.NotContains(t, l.Logs(), marker)
	require.NoError(t, l.Stop())
	assert.Empty(t, found(), "nor after a clean stop")
	out, stderr, code := ledgerctl(t, "verify", "--db", db)
	require.Equal(t, 0, code, "%s%s", out, stderr)
}

// TestRetention_sweeps drives SPEC §14's retention through the real
// binaries on SQLite and PostgreSQL, on ledgerd's test clock: the policy
// member's refusals, one erase receipt per sweep that finds something
// (retention: true, actor ledgerd), none when idle, a key still in flight
// kept, and verify clean.
func TestRetention_sweeps(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, testRetention)
}

func testRetention(t *testing.T, db string) {
	clock := newTestClock(t, t0)
	l := clock.start(t, db, "--default-payloads", "committed", "--retention-interval", "20ms")
	marker := randomMarker(t)
	for _, bad := range []string{`{"retention":{"payloads_ms":59999}}`, `{"retention":{"payloads_ms":"1d"}}`, `{"retention":{"days":1}}`} {
		r := l.Do("PUT", "/v1/namespaces/default/policy", bad)
		require.Equal(t, 400, r.Status, "%s: %s", bad, r.Raw)
	}
	require.Equal(t, 201, l.Do("POST", "/v1/namespaces", `{"name":"plain","payloads":"inline"}`).Status)
	r := l.Do("PUT", "/v1/namespaces/plain/policy", `{"retention":{"payloads_ms":60000}}`)
	require.Equal(t, 400, r.Status, r.Raw)
	assert.Equal(t, "retention", r.Body["error"].(map[string]any)["details"].(map[string]any)["field"])

	rr := l.Do("POST", "/v1/effects/reserve", `{"idempotency_key":"old-00000001","execution_id":"e1","tool":"mail.send","effect":"external","input":{"to":"a"}}`)
	require.Equal(t, 201, rr.Status, rr.Raw)
	l.Commit(t, "old-00000001", `{"reservation":"`+rr.Body["reservation"].(string)+`","outcome":"succeeded","result":{"to":"`+marker+`"}}`)
	open := l.Do("POST", "/v1/effects/reserve", `{"idempotency_key":"open-0000001","execution_id":"e1","tool":"mail.send","effect":"external","input":{"to":"b"},"lease_ms":86400000}`)
	require.Equal(t, 201, open.Status, open.Raw)
	r = l.Do("PUT", "/v1/namespaces/default/policy", `{"retention":{"payloads_ms":60000}}`)
	require.Equal(t, 200, r.Status, r.Raw)
	head := func() float64 { return l.Do("GET", "/v1/head", "").Body["seq"].(float64) }
	before := head()
	time.Sleep(200 * time.Millisecond)
	assert.Equal(t, before, head(), "nothing has expired: a sweep appends nothing")

	clock.advance(61 * time.Second)
	require.Eventually(t, func() bool { return head() == before+1 }, 20*time.Second, 20*time.Millisecond, "one sweep erased")
	time.Sleep(200 * time.Millisecond)
	assert.Equal(t, before+1, head(), "the next sweeps find nothing and append nothing")
	e := l.Do("GET", fmt.Sprintf("/v1/erasures/%d", int(before+1)), "")
	require.Equal(t, 200, e.Status, e.Raw)
	assert.Equal(t, true, e.Body["retention"])
	rec := l.Do("GET", fmt.Sprintf("/v1/receipts/%d", int(before+1)), "")
	assert.Equal(t, "ledgerd", rec.Body["actor"])
	k := l.Do("GET", "/v1/effects/old-00000001", "")
	assert.NotContains(t, k.Raw, marker)
	assert.Contains(t, k.Raw, `"erased":{"result":`)
	assert.Equal(t, []any{[]any{float64(2), float64(2)}}, e.Body["ranges"], "only the finished key's commit; the open key and the policy kept")
	require.NoError(t, l.Stop())
	out, stderr, code := ledgerctl(t, "verify", "--db", db)
	require.Equal(t, 0, code, "%s%s", out, stderr)
}

// TestLedgerctl_erase: `ledgerctl erase` through a running ledgerd, by key
// and by subject, its usage errors, and the refusal of an inline
// namespace's payloads.
func TestLedgerctl_erase(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "ledger.db")
	l := startLedgerdEnv(t, nil, db, "--default-payloads", "committed")
	for i, subj := range []string{"c-1", "c-2"} {
		key := fmt.Sprintf("cli-erase-%04d", i)
		rr := l.Do("POST", "/v1/effects/reserve", `{"idempotency_key":"`+key+`","execution_id":"e1","tool":"mail.send","effect":"external","input":{"i":`+fmt.Sprint(i)+`},"subjects":["`+subj+`"]}`)
		require.Equal(t, 201, rr.Status, rr.Raw)
		l.Commit(t, key, `{"reservation":"`+rr.Body["reservation"].(string)+`","outcome":"succeeded","result":{"n":1}}`)
	}
	out, stderr, code := ledgerctl(t, "erase", "--server", l.URL, "--key", "cli-erase-0000", "--reason", "request 1")
	require.Equal(t, 0, code, stderr)
	assert.Regexp(t, `^erased the payloads of 1 receipts of 1 keys \(erase receipt \d+:[0-9a-f]{64}\)\n$`, out)
	out, stderr, code = ledgerctl(t, "erase", "--server", l.URL, "--subject", "c-2", "--field", "result", "--json")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, `"status":"erased"`)
	out, _, code = ledgerctl(t, "erase", "--server", l.URL, "--subject", "c-2")
	require.Equal(t, 0, code)
	assert.Equal(t, "nothing to erase\n", out)
	for _, args := range [][]string{{}, {"--key", "cli-erase-0000", "--subject", "c-1"}, {"--db", db, "--key", "cli-erase-0000"}, {"extra"}} {
		_, stderr, code := ledgerctl(t, append([]string{"erase", "--server", l.URL}, args...)...)
		assert.Equal(t, 2, code, "%v: %s", args, stderr)
	}
	require.Equal(t, 201, l.Do("POST", "/v1/namespaces", `{"name":"plain","payloads":"inline"}`).Status)
	rr := l.Do("POST", "/v1/ns/plain/effects/reserve", `{"idempotency_key":"cli-erase-0009","execution_id":"e1","tool":"mail.send","effect":"external"}`)
	require.Equal(t, 201, rr.Status, rr.Raw)
	require.Equal(t, 201, l.Do("POST", "/v1/ns/plain/effects/cli-erase-0009/commit", `{"reservation":"`+rr.Body["reservation"].(string)+`","outcome":"succeeded","external_ref":"r"}`).Status)
	_, stderr, code = ledgerctl(t, "erase", "--server", l.URL, "-n", "plain", "--key", "cli-erase-0009")
	assert.NotEqual(t, 0, code)
	assert.Contains(t, stderr, "payloads_inline")
}

// TestVerify_payloadsAbsent: `ledgerctl verify --db` of a committed
// namespace whose payload table is gone (a copy of the receipts alone)
// exits 1 with payloads_absent; --receipts-only checks the chain alone
// and says the payloads are unchecked (SPEC §14).
func TestVerify_payloadsAbsent(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, func(t *testing.T, db string) {
		l := StartLedgerd(t, db)
		tok := l.Reserve(t, `{"idempotency_key":"refund-order-1234","execution_id":"exec-1","tool":"payments.refund","effect":"write"}`)
		l.Commit(t, "refund-order-1234", `{"reservation":"`+tok+`","outcome":"succeeded","external_ref":"re_1","result":{"amount":1200}}`)
		require.NoError(t, l.Stop())
		if strings.HasPrefix(db, "postgres") {
			conn, err := pgx.Connect(context.Background(), db)
			require.NoError(t, err)
			_, err = conn.Exec(context.Background(), `DROP TABLE payloads, erasures`)
			require.NoError(t, err)
			require.NoError(t, conn.Close(context.Background()))
		} else {
			db = copyLedger(t, db, `DROP TABLE ns_payloads`, `DROP TABLE ns_erasures`)
		}
		rep, code := verifyJSON(t, "--db", db)
		assert.Equal(t, 1, code)
		assert.Equal(t, 1, rep.rules()["payloads_absent"], "%+v", rep.Violations)
		out, stderr, code := ledgerctl(t, "verify", "--db", db, "--receipts-only")
		assert.Equal(t, 0, code, out+stderr)
		assert.Contains(t, out, "payloads: unchecked")
	})
}
