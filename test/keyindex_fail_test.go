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

	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

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
	out, _, code := ledgerctl(t, "verify", "--db", l.DB)
	assert.Equal(t, 0, code, out)
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
