package test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLedgerd_diskFull puts the database on a small tmpfs, fills it, and
// checks that writes fail with 503 unavailable, /readyz turns unready,
// nothing partial is appended, and the service recovers by itself when
// space is freed. It needs to mount a tmpfs (root, as in CI).
func TestLedgerd_diskFull(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// 16 MiB: the key index preallocates its log (a memtable's worth,
	// ~3 MiB at the default --cache-mib) before the test fills the rest.
	mountTmpfs(t, dir, "16m")
	l := StartLedgerd(t, filepath.Join(dir, "ledger.db"))
	reserve := func(i int) Resp {
		return l.Do("POST", "/v1/effects/reserve", fmt.Sprintf(`{"idempotency_key":"disk-key-%06d","execution_id":"e","tool":"t","effect":"write","input":{"pad":%q}}`, i, strings.Repeat("x", 2000)))
	}
	require.Equal(t, 201, reserve(0).Status)

	// Fill the filesystem.
	junk := filepath.Join(dir, "junk")
	fillDisk(t, junk)

	var full Resp
	for i := 1; i < 2000; i++ { // the WAL may have room for a few more
		if full = reserve(i); full.Status != 201 {
			break
		}
	}
	require.Equal(t, 503, full.Status, full.Raw)
	assert.Equal(t, "unavailable", full.Code())
	assert.NotEmpty(t, full.Header.Get("Retry-After"))
	head := l.Do("GET", "/v1/head", "").Body
	assert.Equal(t, 503, l.Do("GET", "/readyz", "").Status)

	require.NoError(t, os.Remove(junk))
	require.Eventually(t, func() bool { return l.Do("GET", "/readyz", "").Status == 200 }, 60*time.Second, 50*time.Millisecond)
	r := reserve(99999)
	require.Equal(t, 201, r.Status, r.Raw)
	assert.Equal(t, head["seq"].(float64)+1, r.Body["receipt"].(map[string]any)["seq"], "nothing partial was appended")
	require.NoError(t, l.Stop())
	verified(t, l.DB)
}

// TestLedgerd_indexDiskFull_tmpfs gives the key index (<db>.idx/) a
// small tmpfs of its own and fills it while the ledger file has room:
// writes answer 503 unavailable without a panic, a spin or a log line
// each, a restart on the still-full disk serves /healthz and 503 too, and
// once space is freed ledgerd replays the index by itself and every
// acknowledged receipt is there. It needs to mount a tmpfs (root, as in
// CI).
func TestLedgerd_indexDiskFull_tmpfs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	idx := db + ".idx"
	require.NoError(t, os.Mkdir(idx, 0o755))
	mountTmpfs(t, idx, "32m")
	l := StartLedgerd(t, db)
	pair(t, l, "", "before-full-1")

	junk := filepath.Join(idx, "junk")
	fillDisk(t, junk)

	acked, r := reserveUntilRefused(l)
	requireUnavailable(t, r)
	requireQuietWhileFull(t, l)

	require.NoError(t, l.Stop(), "a clean stop: the ledger file is fine")
	l = StartLedgerd(t, db)
	assert.Equal(t, 200, l.Do("GET", "/healthz", "").Status)
	requireQuietWhileFull(t, l)

	require.NoError(t, os.Remove(junk))
	require.Eventually(t, func() bool { return l.Do("GET", "/readyz", "").Status == 200 }, 30*time.Second, 50*time.Millisecond)
	requireReplayed(t, l, "", "before-full-1")
	for _, key := range acked {
		r := l.Do("GET", "/v1/effects/"+key, "")
		require.Equal(t, 200, r.Status, "acknowledged %s: %s", key, r.Raw)
	}
	require.NoError(t, l.Stop())
	verified(t, db)
}

// mountTmpfs mounts a tmpfs of size on dir until t ends, or skips t where
// it cannot (it needs root, as in CI).
func mountTmpfs(t *testing.T, dir, size string) {
	t.Helper()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here (needs root): %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
}

// fillDisk writes junk to path until its filesystem is full.
func fillDisk(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	require.NoError(t, err)
	chunk := bytes.Repeat([]byte{1}, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			break
		}
	}
	_ = f.Close()
}
