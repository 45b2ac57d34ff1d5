package test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The key index (<ledger>.idx/) is derived from the receipts: whatever
// happens to it, ledgerd never decides from an index that lacks a
// committed receipt or belongs to another chain. These tests damage it in
// each way and check the one thing that matters: a committed key is
// replayed, never reserved again.

// pair reserves and commits key in the namespace of prefix ("" or
// "/v1/ns/NAME").
func pair(t *testing.T, l *Ledgerd, prefix, key string) {
	t.Helper()
	r := l.Do("POST", prefixed(prefix, "/v1/effects/reserve"), reserve(key, "exec-"+key, 1, false))
	require.Equal(t, 201, r.Status, r.Raw)
	r = l.Do("POST", prefixed(prefix, "/v1/effects/"+key+"/commit"),
		`{"reservation":"`+r.Body["reservation"].(string)+`","outcome":"succeeded","result":{"key":"`+key+`"}}`)
	require.Equal(t, 201, r.Status, r.Raw)
}

func prefixed(prefix, path string) string {
	if prefix == "" {
		return path
	}
	return prefix + strings.TrimPrefix(path, "/v1")
}

// requireReplayed reserves key again and requires the recorded result.
func requireReplayed(t *testing.T, l *Ledgerd, prefix, key string) {
	t.Helper()
	r := l.Do("POST", prefixed(prefix, "/v1/effects/reserve"), reserve(key, "exec-again-"+key, 1, false))
	require.Equal(t, 200, r.Status, "%s must be replayed, not reserved again: %s", key, r.Raw)
	assert.Equal(t, "replayed", r.Body["status"])
}

// TestLedgerd_indexCrashAfterCommit kills ledgerd between a durable
// COMMIT and the index apply of that batch, in the default namespace and
// in another: after the restart the index replays the tail, so the
// committed key is replayed.
func TestLedgerd_indexCrashAfterCommit(t *testing.T) {
	for _, prefix := range []string{"", "/v1/ns/pay"} {
		t.Run("namespace"+strings.ReplaceAll(prefix, "/", "_"), func(t *testing.T) {
			db := filepath.Join(t.TempDir(), "ledger.db")
			l := StartLedgerd(t, db)
			if prefix != "" {
				require.Equal(t, 201, l.Do("POST", "/v1/namespaces", `{"name":"pay"}`).Status)
			}
			pair(t, l, prefix, "before-crash-1")
			require.NoError(t, l.Stop())

			// Killed after its second commit: the reserve's batch, then the commit's.
			l = startLedgerdEnv(t, []string{"LEDGERD_TEST_KILL_AFTER_COMMIT=2"}, db)
			r := l.Do("POST", prefixed(prefix, "/v1/effects/reserve"), reserve("crash-key-01", "exec-1", 1, false))
			require.Equal(t, 201, r.Status, r.Raw)
			_, _, err := rawPost(l.URL+prefixed(prefix, "/v1/effects/crash-key-01/commit"),
				`{"reservation":"`+r.Body["reservation"].(string)+`","outcome":"succeeded","result":{"sent":true}}`)
			require.Error(t, err, "ledgerd died before it answered")
			l.Kill()

			l = StartLedgerd(t, db)
			requireReplayed(t, l, prefix, "crash-key-01")
			requireReplayed(t, l, prefix, "before-crash-1")
			assert.Contains(t, l.Logs(), `"msg":"key index up to date"`, "the index replayed the receipts it lacked")
			assert.NotContains(t, l.Logs(), "rebuilding the key index", "a replay of the tail, not a rebuild")
			out, _, code := ledgerctl(t, "verify", "--db", db, "--all-namespaces")
			assert.Equal(t, 0, code, out)
		})
	}
}

// TestLedgerd_indexDamaged takes the index away, restores an older copy
// of it, swaps in another ledger's index and fills it with junk; each time
// ledgerd replays or rebuilds it from the receipts before it serves.
func TestLedgerd_indexDamaged(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	idx := db + ".idx"
	l := StartLedgerd(t, db)
	require.Equal(t, 201, l.Do("POST", "/v1/namespaces", `{"name":"pay"}`).Status)
	pair(t, l, "", "first-key-01")
	pair(t, l, "/v1/ns/pay", "first-key-02")
	open := l.Do("POST", "/v1/effects/reserve", reserve("open-key-001", "exec-open", 1, false))
	require.Equal(t, 201, open.Status, open.Raw)
	require.NoError(t, l.Stop())
	older := filepath.Join(dir, "older.idx")
	copyDir(t, idx, older)

	l = StartLedgerd(t, db)
	pair(t, l, "", "later-key-01")
	pair(t, l, "/v1/ns/pay", "later-key-02")
	require.NoError(t, l.Stop())

	// Another ledger, with a key of the same name that failed there.
	other := filepath.Join(dir, "other.db")
	lo := StartLedgerd(t, other)
	require.Equal(t, 201, lo.Do("POST", "/v1/namespaces", `{"name":"pay"}`).Status)
	for _, key := range []string{"later-key-01", "foreign-key-1"} {
		pair(t, lo, "", key)
	}
	pair(t, lo, "/v1/ns/pay", "foreign-key-2")
	require.NoError(t, lo.Stop())

	check := func(t *testing.T, wantLog string, rebuilt bool) {
		l := StartLedgerd(t, db)
		for _, k := range []string{"first-key-01", "later-key-01"} {
			requireReplayed(t, l, "", k)
		}
		for _, k := range []string{"first-key-02", "later-key-02"} {
			requireReplayed(t, l, "/v1/ns/pay", k)
		}
		r := l.Do("POST", "/v1/effects/foreign-key-1/commit", `{"reservation":"rsv_x","outcome":"succeeded"}`)
		assert.Equal(t, 404, r.Status, "another ledger's keys are unknown here: %s", r.Raw)
		r = l.Do("GET", "/v1/ns/pay/effects/foreign-key-2", "")
		assert.Equal(t, 404, r.Status, r.Raw)
		r = l.Do("GET", "/v1/receipts?tool=email.send&limit=1000", "")
		require.Equal(t, 200, r.Status, r.Raw)
		rs := r.Body["receipts"].([]any)
		assert.GreaterOrEqual(t, len(rs), 5)
		for _, rc := range rs {
			assert.NotContains(t, rc.(map[string]any)["idempotency_key"], "foreign", "the tool list holds this ledger's receipts only")
		}
		assert.Contains(t, l.Logs(), wantLog)
		if !rebuilt {
			assert.NotContains(t, l.Logs(), "rebuilding the key index", "a replay of the tail, not a rebuild")
		}
		require.NoError(t, l.Stop())
	}

	t.Run("deleted", func(t *testing.T) {
		require.NoError(t, os.RemoveAll(idx))
		check(t, "the index holds nothing of this namespace", true)
	})
	t.Run("older copy", func(t *testing.T) {
		require.NoError(t, os.RemoveAll(idx))
		copyDir(t, older, idx)
		check(t, `"msg":"key index up to date"`, false)
	})
	t.Run("another ledger's", func(t *testing.T) {
		require.NoError(t, os.RemoveAll(idx))
		copyDir(t, other+".idx", idx)
		check(t, "the index is of another chain", true)
	})
	t.Run("junk", func(t *testing.T) {
		require.NoError(t, os.RemoveAll(idx))
		require.NoError(t, os.MkdirAll(idx, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(idx, "CURRENT"), []byte("not a manifest\n"), 0o644))
		check(t, "the key index cannot be opened; setting it aside", true)
		aside, err := filepath.Glob(idx + ".unreadable-*")
		require.NoError(t, err)
		assert.Len(t, aside, 1, "the damaged index is kept for a look, not deleted")
	})

	// The reservation left open before all this still commits: its token
	// hash is kept with the receipts and survives every rebuild.
	l = StartLedgerd(t, db)
	r := l.Do("POST", "/v1/effects/open-key-001/commit", `{"reservation":"`+open.Body["reservation"].(string)+`","outcome":"succeeded"}`)
	assert.Equal(t, 201, r.Status, r.Raw)
	out, _, code := ledgerctl(t, "verify", "--db", db, "--all-namespaces")
	assert.Equal(t, 0, code, out)
}

// TestLedgerctl_rebuildIndex rebuilds the index of a stopped ledger, and
// is refused while ledgerd holds it.
func TestLedgerctl_rebuildIndex(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "ledger.db")
	l := StartLedgerd(t, db)
	pair(t, l, "", "rebuild-key-1")
	_, stderr, code := ledgerctl(t, "rebuild-index", "--db", db)
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "already open")
	require.NoError(t, l.Stop())
	out, stderr, code := ledgerctl(t, "rebuild-index", "--db", db, "--json")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, `"seq":2`)
	assert.Contains(t, stderr, "rebuilding the key index", "progress goes to stderr")
	l = StartLedgerd(t, db)
	requireReplayed(t, l, "", "rebuild-key-1")
}

func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(dst, 0o755))
	entries, err := os.ReadDir(src)
	require.NoError(t, err)
	for _, e := range entries {
		if !e.Type().IsRegular() || e.Name() == "LOCK" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644))
	}
}
