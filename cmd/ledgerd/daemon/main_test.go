package daemon_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/cmd/ledgerd/daemon"
	"github.com/effect-ledger/effect-ledger/testkit"
)

// TestMain_Run serves in-process with the seams set as fields: receipts
// are dated by Now, and AfterCommit sees each durable commit.
func TestMain_Run(t *testing.T) {
	logs := &testkit.Buffer{}
	m := daemon.NewMain(logs)
	require.NoError(t, m.ParseFlags(t.Context(), []string{"--db", filepath.Join(t.TempDir(), "ledger.db"), "--listen", "127.0.0.1:0"}))
	clock := testkit.NewClock()
	var commits atomic.Int64
	m.Now, m.AfterCommit = clock.Now, func() { commits.Add(1) }

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	var addr string
	select {
	case a := <-m.Addr:
		addr = a.String()
	case err := <-done:
		t.Fatalf("Run: %v\n%s", err, logs)
	}
	res, err := http.Post("http://"+addr+"/v1/effects/reserve", "application/json",
		strings.NewReader(`{"idempotency_key":"in-process-0001","execution_id":"e-1","tool":"t.x","effect":"write"}`))
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, res.StatusCode)
	require.NoError(t, res.Body.Close())
	res, err = http.Get("http://" + addr + "/v1/receipts")
	require.NoError(t, err)
	var body struct {
		Receipts []struct {
			RecordedAt int64 `json:"recorded_at"`
		} `json:"receipts"`
	}
	require.NoError(t, json.NewDecoder(res.Body).Decode(&body))
	require.NoError(t, res.Body.Close())
	require.Len(t, body.Receipts, 1)
	assert.Equal(t, int64(testkit.T0), body.Receipts[0].RecordedAt, "dated by Now")
	assert.Positive(t, commits.Load(), "AfterCommit called")

	cancel()
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("Run did not return after its context ended")
	}
	assert.Contains(t, logs.String(), "stopped")
}

// TestMain_Execute: the exit codes of the command, without a process.
func TestMain_Execute(t *testing.T) {
	for _, tt := range []struct {
		desc string
		args []string
		code int
		want string
	}{
		{"help", []string{"--help"}, 0, "Usage: ledgerd"},
		{"ErrFlag", []string{"--no-such-flag"}, 2, "no-such-flag"},
		{"ErrFlagValue", []string{"--rate-burst", "0"}, 2, "--rate-burst must be at least 1"},
		{"ErrRun", []string{"--db", filepath.Join(t.TempDir(), "missing", "l.db"), "--listen", "127.0.0.1:0"}, 1, "does not exist"},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			out := &testkit.Buffer{}
			m := daemon.NewMain(out)
			assert.Equal(t, tt.code, m.Execute(t.Context(), tt.args))
			assert.Contains(t, out.String(), tt.want)
		})
	}
}

// TestMain_archiveDir: --archive-dir must name an existing directory
// ledgerd can write and fsync a file in, checked before the database is
// opened or created (exit 1, nothing created); one that is stops with a
// probe file removed. --prune-interval is 0 or at least a minute.
func TestMain_archiveDir(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "a-file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	for _, tt := range []struct {
		desc, archive, want string
		code                int
	}{
		{"missing", filepath.Join(dir, "none"), "does not exist", 1},
		{"a file", file, "is not a directory", 1},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			db := filepath.Join(t.TempDir(), "l.db")
			out := &testkit.Buffer{}
			m := daemon.NewMain(out)
			assert.Equal(t, tt.code, m.Execute(t.Context(), []string{"--db", db, "--listen", "127.0.0.1:0", "--archive-dir", tt.archive}))
			assert.Contains(t, out.String(), "--archive-dir")
			assert.Contains(t, out.String(), tt.want)
			_, err := os.Stat(db)
			assert.ErrorIs(t, err, os.ErrNotExist, "no database created")
		})
	}
	out := &testkit.Buffer{}
	m := daemon.NewMain(out)
	assert.Equal(t, 2, m.Execute(t.Context(), []string{"--prune-interval", "30s"}))
	assert.Contains(t, out.String(), "--prune-interval must be 0 (only when asked) or at least 1m")

	archive := t.TempDir()
	logs := &testkit.Buffer{}
	m = daemon.NewMain(logs)
	require.NoError(t, m.ParseFlags(t.Context(), []string{"--db", filepath.Join(t.TempDir(), "ledger.db"), "--listen", "127.0.0.1:0",
		"--archive-dir", archive}))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	select {
	case a := <-m.Addr:
		require.Eventually(t, func() bool {
			res, err := http.Get("http://" + a.String() + "/healthz")
			if err == nil {
				_ = res.Body.Close()
			}
			return err == nil && res.StatusCode == http.StatusOK
		}, time.Minute, 10*time.Millisecond)
	case err := <-done:
		t.Fatalf("Run: %v\n%s", err, logs)
	}
	entries, err := os.ReadDir(archive)
	require.NoError(t, err)
	assert.Empty(t, entries, "the probe file is removed")
	cancel()
	assert.NoError(t, <-done)
}
