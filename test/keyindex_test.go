package test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
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
		testkit.CopyFile(t, filepath.Join(src, e.Name()), filepath.Join(dst, e.Name()))
	}
}

// The key index's disk fills up, or one of its files is corrupt: ledgerd
// neither dies nor spins, loses no acknowledged receipt, and recovers by
// itself (a full disk: once there is room; a corrupt index: moved aside
// and rebuilt from the receipts).

// cpuSeconds is the CPU time ledgerd has used so far.
func cpuSeconds(t *testing.T, l *Ledgerd) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", l.cmd.Process.Pid))
	if err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:])) // fields from the state on
	utime, err := strconv.ParseFloat(f[11], 64)
	require.NoError(t, err)
	stime, err := strconv.ParseFloat(f[12], 64)
	require.NoError(t, err)
	return (utime + stime) / 100 // USER_HZ
}

// requireAlive fails t if ledgerd has exited.
func requireAlive(t *testing.T, l *Ledgerd) {
	t.Helper()
	select {
	case err := <-l.exit:
		l.exit <- err
		t.Fatalf("ledgerd exited (%v):\n%s", err, l.Logs())
	default:
	}
}

// requireUnavailable requires 503 unavailable with Retry-After.
func requireUnavailable(t *testing.T, r Resp) {
	t.Helper()
	require.Equal(t, 503, r.Status, r.Raw)
	assert.Equal(t, "unavailable", r.Code(), r.Raw)
	assert.NotEmpty(t, r.Header.Get("Retry-After"))
}

// reserveUntilRefused reserves the keys acked-key-000000, -000001, …
// (5000 at most) until one is not answered 201; it returns the keys
// acknowledged and the last answer.
func reserveUntilRefused(l *Ledgerd) ([]string, Resp) {
	var acked []string
	var r Resp
	for i := 0; i < 5000; i++ {
		key := fmt.Sprintf("acked-key-%06d", i)
		if r = l.Do("POST", "/v1/effects/reserve", reserve(key, "exec-"+key, 1, false)); r.Status != 201 {
			break
		}
		acked = append(acked, key)
	}
	return acked, r
}

// requireQuietWhileFull sends requests for a while and requires ledgerd
// to answer each 503, log a few lines at most and stay off the CPU.
func requireQuietWhileFull(t *testing.T, l *Ledgerd) {
	t.Helper()
	lines, cpu := strings.Count(l.Logs(), "\n"), cpuSeconds(t, l)
	start := time.Now()
	for i := 0; time.Since(start) < 3*time.Second; i++ {
		requireUnavailable(t, l.Do("POST", "/v1/effects/reserve", reserve(fmt.Sprintf("full-key-%06d", i), "exec-full", 1, false)))
		assert.Equal(t, 200, l.Do("GET", "/healthz", "").Status, "alive")
		time.Sleep(5 * time.Millisecond)
	}
	requireUnavailable(t, l.Do("GET", "/readyz", ""))
	requireAlive(t, l)
	used := cpuSeconds(t, l) - cpu
	logged := strings.Count(l.Logs(), "\n") - lines
	t.Logf("while full: %.2f s of CPU, %d log lines in %v", used, logged, time.Since(start))
	assert.Less(t, used, 1.0, "no hot loop")
	assert.Less(t, logged, 10, "about a line every few seconds:\n%s", l.Logs())
}

// TestLedgerd_indexDiskFull fills the key index's disk while ledgerd
// serves (LEDGERD_TEST_INDEX_FULL_IF: every write of the index's files
// fails with ENOSPC, as a full disk would make it), then frees it.
func TestLedgerd_indexDiskFull(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	full := filepath.Join(dir, "full")
	l := startLedgerdEnv(t, []string{"LEDGERD_TEST_INDEX_FULL_IF=" + full}, filepath.Join(dir, "ledger.db"))
	pair(t, l, "", "before-full-1")

	require.NoError(t, os.WriteFile(full, nil, 0o644))
	acked, r := reserveUntilRefused(l) // Pebble buffers its log: the first writes may pass
	requireUnavailable(t, r)
	requireAlive(t, l)
	requireQuietWhileFull(t, l)
	requireUnavailable(t, l.Do("GET", "/v1/effects/before-full-1", ""))

	require.NoError(t, os.Remove(full))
	require.Eventually(t, func() bool { return l.Do("GET", "/readyz", "").Status == 200 }, 30*time.Second, 50*time.Millisecond)
	requireReplayed(t, l, "", "before-full-1")
	for _, key := range acked {
		r := l.Do("GET", "/v1/effects/"+key, "")
		require.Equal(t, 200, r.Status, "acknowledged %s: %s", key, r.Raw)
		assert.Equal(t, "reserved", r.Body["state"], key)
	}
	pair(t, l, "", "after-full-1")
	assert.Contains(t, l.Logs(), "key index replayed")
	require.NoError(t, l.Stop())
	verified(t, l.DB)
}

// TestLedgerd_indexDiskFullAtStart starts ledgerd on a ledger whose key
// index's disk is full: it serves /healthz and answers 503 instead of
// spinning, and catches up by itself once the disk has room.
func TestLedgerd_indexDiskFullAtStart(t *testing.T) {
	t.Parallel()
	for _, missing := range []bool{false, true} {
		t.Run(map[bool]string{false: "index present", true: "index missing"}[missing], func(t *testing.T) {
			dir := t.TempDir()
			db := filepath.Join(dir, "ledger.db")
			l := StartLedgerd(t, db)
			pair(t, l, "", "before-start-1")
			require.NoError(t, l.Stop())
			if missing {
				require.NoError(t, os.RemoveAll(db+".idx"))
			}

			full := filepath.Join(dir, "full")
			require.NoError(t, os.WriteFile(full, nil, 0o644))
			l = startLedgerdEnv(t, []string{"LEDGERD_TEST_INDEX_FULL_IF=" + full}, db)
			assert.Equal(t, 200, l.Do("GET", "/healthz", "").Status)
			requireQuietWhileFull(t, l)

			require.NoError(t, os.Remove(full))
			require.Eventually(t, func() bool { return l.Do("GET", "/readyz", "").Status == 200 }, 30*time.Second, 50*time.Millisecond)
			requireReplayed(t, l, "", "before-start-1")
			require.NoError(t, l.Stop())
		})
	}
}

// indexedLedger makes a stopped ledger of n committed keys whose key
// index is one compacted table, and returns its path and keys.
func indexedLedger(t *testing.T, n int) (string, []string) {
	t.Helper()
	db := filepath.Join(t.TempDir(), "ledger.db")
	l := StartLedgerd(t, db)
	var keys []string
	for i := range n {
		key := fmt.Sprintf("corrupt-key-%05d", i)
		pair(t, l, "", key)
		keys = append(keys, key)
	}
	require.NoError(t, l.Stop())
	_, stderr, code := ledgerctl(t, "rebuild-index", "--db", db)
	require.Equal(t, 0, code, stderr)
	return db, keys
}

// TestLedgerd_indexCorrupt starts ledgerd on a key index with a corrupt
// table, one that the open meets and one that only a key lookup meets:
// the index is moved aside and rebuilt, and every committed key is
// replayed; the ledger file is not changed.
func TestLedgerd_indexCorrupt(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name     string
		from, to float64
		wantLog  string
	}{
		{"at open", 0.01, 0.99, "the key index cannot be opened; setting it aside"},
		{"on a lookup", 0.3, 0.6, "the key index is corrupt; moved it aside"}, // the format key (first) and the table's index (last) stay readable
	} {
		t.Run(tt.name, func(t *testing.T) {
			db, keys := indexedLedger(t, 150)
			ledgertest.CorruptTables(t, db+".idx", tt.from, tt.to)

			l := StartLedgerd(t, db)
			for _, key := range keys {
				var r Resp
				for range 50 { // the lookup that meets the corruption answers 503; a retry finds it rebuilt
					if r = l.Do("POST", "/v1/effects/reserve", reserve(key, "exec-again-"+key, 1, false)); r.Status != 503 {
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
				require.Equal(t, 200, r.Status, "%s must be replayed: %s", key, r.Raw)
				assert.Equal(t, "replayed", r.Body["status"])
			}
			pair(t, l, "", "after-corrupt-1")
			requireAlive(t, l)
			aside, err := filepath.Glob(db + ".idx.unreadable-*")
			require.NoError(t, err)
			assert.Len(t, aside, 1, "the corrupt index is moved aside, not deleted")
			assert.Contains(t, l.Logs(), tt.wantLog)
			assert.Contains(t, l.Logs(), `"moved_to":"`+aside[0]+`"`, "the log says where it went")
			require.NoError(t, l.Stop())
			verified(t, db)
		})
	}
}

// TestLedgerctl_rebuildIndexCorrupt runs ledgerctl rebuild-index on a
// key index with a corrupt table: it moves the index aside and rebuilds
// it, exit 0.
func TestLedgerctl_rebuildIndexCorrupt(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name     string
		from, to float64
	}{{"whole table", 0.01, 0.99}, {"middle of the table", 0.3, 0.6}} {
		t.Run(tt.name, func(t *testing.T) {
			db, keys := indexedLedger(t, 150)
			ledgertest.CorruptTables(t, db+".idx", tt.from, tt.to)
			out, stderr, code := ledgerctl(t, "rebuild-index", "--db", db, "--json")
			require.Equal(t, 0, code, stderr)
			assert.Contains(t, out, `"seq":300`)
			assert.Contains(t, stderr, "moved_to="+db+".idx.unreadable-", "the log says where it went")
			aside, err := filepath.Glob(db + ".idx.unreadable-*")
			require.NoError(t, err)
			assert.Len(t, aside, 1, "the corrupt index is moved aside, not deleted")

			l := StartLedgerd(t, db)
			for _, key := range keys[:10] {
				requireReplayed(t, l, "", key)
			}
			assert.NotContains(t, l.Logs(), "rebuilding the key index", "rebuild-index rebuilt it")
		})
	}
}
