package test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestErasure_awaitingApproval (SPEC §13, §14): an erasure of a key that
// waits for its approval answers it as pending; the approver's note and
// the result of the run it then allows are erased as the key finalizes,
// are in no answer, and the verifier accepts the chain.
func TestErasure_awaitingApproval(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, func(t *testing.T, db string) {
		l := StartLedgerd(t, db, "--default-payloads", "committed")
		r := l.Do("PUT", "/v1/namespaces/default/policy", `{"rules":[{"tool":"payments.*","approval":"required"}]}`)
		require.Equal(t, 200, r.Status, r.Raw)
		marker := randomMarker(t)
		key := "held-" + marker[:12]
		body := fmt.Sprintf(`{"idempotency_key":%q,"execution_id":"e1","tool":"payments.charge","effect":"external",
			"input":{"card":"4242"},"approval_summary":"refund %s","subjects":["person-%s"]}`, key, marker, marker)
		ask := l.Do("POST", "/v1/effects/reserve", body)
		require.Equal(t, 202, ask.Status, ask.Raw)

		e := l.Do("POST", "/v1/erasures", fmt.Sprintf(`{"subject":"person-%s","reason":"erasure request"}`, marker))
		require.Equal(t, 201, e.Status, e.Raw)
		assert.Equal(t, []any{key}, e.Body["pending"], e.Raw)

		a := l.Do("POST", fmt.Sprintf("/v1/approvals/%d", num(t, ask.Body, "approval", "seq")),
			fmt.Sprintf(`{"decision":"approve","note":"approved for %s"}`, marker))
		require.Equal(t, 201, a.Status, a.Raw)
		assert.NotContains(t, a.Raw, marker, "the answer to a marked ask is erased as it is recorded")
		assert.Contains(t, a.Raw, `"erased":{"note":`)
		rr := l.Do("POST", "/v1/effects/reserve", body)
		require.Equal(t, 201, rr.Status, rr.Raw)
		c := l.Commit(t, key, fmt.Sprintf(`{"reservation":%q,"outcome":"succeeded","result":{"charged":%q},"external_ref":"ch_%s"}`,
			rr.Body["reservation"].(string), marker, marker))
		assert.NotContains(t, c.Raw, marker, "the commit's answer")

		k := l.Do("GET", "/v1/effects/"+key+"?history=true", "")
		require.Equal(t, 200, k.Status, k.Raw)
		assert.NotContains(t, k.Raw, marker, "the key's receipts")
		assert.Contains(t, k.Raw, `"erased":{`)
		all := l.Do("GET", "/v1/receipts?limit=100", "")
		require.Equal(t, 200, all.Status, all.Raw)
		assert.NotContains(t, all.Raw, marker, "the receipts")
		require.NoError(t, l.Stop())
		out, stderr, code := ledgerctl(t, "verify", "--db", db)
		require.Equal(t, 0, code, "%s%s", out, stderr)
	})
}

// TestNamespaceForget_erasesPayloadsFirst (SPEC §14): `ledgerctl namespace
// forget` of a committed namespace erases its values before its rows
// leave the ledger file: no file beside the ledger — the kept copy, the
// ledger file, its WAL — holds them after, an approver's input included,
// and both verify. A reason that cannot be an erase's note is refused
// first.
func TestNamespaceForget_erasesPayloadsFirst(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	marker := randomMarker(t)
	l := StartLedgerd(t, db)
	require.Equal(t, 201, l.Do("POST", "/v1/namespaces", `{"name":"tenant","payloads":"committed"}`).Status)
	for i := range 30 {
		key := fmt.Sprintf("tenant-%08d", i)
		lease := ""
		if i == 29 {
			lease = `,"lease_ms":86400000` // still in flight when forgotten
		}
		rr := l.Do("POST", "/v1/ns/tenant/effects/reserve", `{"idempotency_key":"`+key+`","execution_id":"e1","tool":"mail.send","effect":"external","input":{"i":`+fmt.Sprint(i)+`}`+lease+`}`)
		require.Equal(t, 201, rr.Status, rr.Raw)
		if i < 29 {
			c := l.Do("POST", "/v1/ns/tenant/effects/"+key+"/commit", `{"reservation":"`+rr.Body["reservation"].(string)+
				`","outcome":"succeeded","external_ref":"ref-`+marker+`","result":{"to":"`+strings.Repeat(marker, 50)+`"}}`)
			require.Equal(t, 201, c.Status, c.Raw)
		}
	}
	e := l.Do("POST", "/v1/ns/tenant/erasures", `{"keys":["tenant-00000000"],"reason":"request 1"}`)
	require.Equal(t, 201, e.Status, e.Raw)
	// A held call: the input shown to its approver is a value too.
	p := l.Do("PUT", "/v1/namespaces/tenant/policy", `{"rules":[{"tool":"payments.*","approval":"required"}]}`)
	require.Equal(t, 200, p.Status, p.Raw)
	ask := l.Do("POST", "/v1/ns/tenant/effects/reserve", `{"idempotency_key":"tenant-held-01","execution_id":"e1","tool":"payments.charge","effect":"external","input":{"card":"`+marker+`"}}`)
	require.Equal(t, 202, ask.Status, ask.Raw)
	require.NoError(t, l.Stop())
	found := func() []string {
		var where []string
		_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if b, rerr := os.ReadFile(path); err == nil && !d.IsDir() && rerr == nil && bytes.Contains(b, []byte(marker)) {
				where = append(where, path)
			}
			return nil
		})
		return where
	}
	require.NotEmpty(t, found(), "the test can fail: the values are in the files before")

	// What a forget killed before it recorded its decision leaves, and a
	// copy of another namespace whose name starts alike.
	for _, stray := range []string{".forgotten-tenant-123", ".forgotten-tenant-124.new", ".forgotten-tenant-x-125"} {
		require.NoError(t, os.WriteFile(db+stray, []byte("stray"), 0o600))
	}
	_, stderr, code := ledgerctl(t, "namespace", "forget", "--db", db, "tenant", "--by", "alice", "--reason", strings.Repeat("R", 257))
	require.Equal(t, 2, code, stderr)
	assert.Contains(t, stderr, "--reason must be UTF-8 of at most 256 characters")
	stdout, stderr, code := ledgerctl(t, "namespace", "forget", "--db", db, "tenant", "--by", "alice", "--reason", "tenant left (INC-7)")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "its payloads erased first")
	assert.Empty(t, found(), "no file holds a value of the forgotten namespace")
	assert.NoFileExists(t, db+".forgotten-tenant-123", "a killed forget's copy goes")
	assert.NoFileExists(t, db+".forgotten-tenant-124.new")
	assert.FileExists(t, db+".forgotten-tenant-x-125", "another namespace's stays")
	require.NoError(t, os.Remove(db+".forgotten-tenant-x-125"))
	kept, err := filepath.Glob(db + ".forgotten-tenant-*")
	require.NoError(t, err)
	require.Len(t, kept, 1)
	out, stderr, code := ledgerctl(t, "verify", "--db", kept[0])
	require.Equal(t, 0, code, "%s%s", out, stderr)
	out, stderr, code = ledgerctl(t, "audit", "--db", kept[0], "--json")
	require.Equal(t, 0, code, "%s%s", out, stderr)
	assert.Contains(t, out, `"actor":"alice"`, "the erase receipt names who forgot it")
	out, stderr, code = ledgerctl(t, "verify", "--db", db, "--all-namespaces")
	require.Equal(t, 0, code, "%s%s", out, stderr)
}
