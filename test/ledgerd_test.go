package test

import (
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	_ "github.com/mattn/go-sqlite3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
)

func reserve(key, exec string, attempt int, idempotent bool) string {
	return fmt.Sprintf(`{"idempotency_key":%q,"execution_id":%q,"attempt":%d,"tool":"email.send","effect":"external","idempotent":%t,"input":{"to":"a@example.com"}}`,
		key, exec, attempt, idempotent)
}

// TestLedgerd_walkthrough follows docs/walkthrough.md: reserve, commit, replay, a
// failed effect and its retry, through the real binary.
func TestLedgerd_walkthrough(t *testing.T) {
	t.Parallel()
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"))

	token := l.Reserve(t, reserve("mail-0001-abc", "exec-1", 1, true))
	l.Commit(t, "mail-0001-abc", `{"reservation":"`+token+`","outcome":"succeeded","external_ref":"msg_1","result":{"id":"msg_1"}}`)
	r := l.Do("POST", "/v1/effects/reserve", reserve("mail-0001-abc", "exec-2", 1, true))
	require.Equal(t, 200, r.Status, r.Raw)
	assert.Equal(t, "replayed", r.Body["status"])
	assert.Equal(t, "msg_1", r.Body["external_ref"])
	assert.Equal(t, "true", r.Header.Get("Idempotent-Replayed"))

	token = l.Reserve(t, reserve("mail-0002-abc", "exec-3", 1, true))
	l.Commit(t, "mail-0002-abc", `{"reservation":"`+token+`","outcome":"failed","error":{"code":"TIMEOUT","message":"smtp timed out","retryable":true}}`)
	r = l.Do("POST", "/v1/effects/reserve", reserve("mail-0002-abc", "exec-3", 1, true))
	assert.Equal(t, 409, r.Status)
	assert.Equal(t, "attempt_conflict", r.Code())
	r = l.Do("POST", "/v1/effects/reserve", reserve("mail-0002-abc", "exec-3", 2, true))
	require.Equal(t, 201, r.Status, r.Raw)
	assert.Equal(t, true, r.Body["retry"])

	// A non-idempotent call interrupted by an expired lease needs a person.
	r = l.Do("POST", "/v1/effects/reserve", `{"idempotency_key":"charge-0003","execution_id":"exec-4","tool":"payments.charge","effect":"write","lease_ms":10}`)
	require.Equal(t, 201, r.Status, r.Raw)
	require.Eventually(t, func() bool {
		r = l.Do("POST", "/v1/effects/reserve", `{"idempotency_key":"charge-0003","execution_id":"exec-5","tool":"payments.charge","effect":"write"}`)
		return r.Status == 409 && r.Code() == "unsafe_resume"
	}, 60e9, 20e6) // 60 s: generous on a loaded machine
	r = l.Do("POST", "/v1/effects/charge-0003/resolve", `{"outcome":"failed","error":{"code":"NOT_CHARGED"},"note":"checked the PSP: no charge"}`)
	require.Equal(t, 201, r.Status, r.Raw)
	assert.Equal(t, "failed", r.Body["state"])

	r = l.Do("GET", "/v1/head", "")
	require.Equal(t, 200, r.Status)
	assert.Equal(t, 8.0, r.Body["seq"])
	checkFile(t, l.DB, uint64(r.Body["seq"].(float64)), r.Body["hash"].(string))
}

// checkFile recomputes the chain from the SQLite file with the chain
// package alone and compares its head.
func checkFile(t *testing.T, path string, wantSeq uint64, wantHash string) {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
	require.NoError(t, err)
	defer db.Close()
	rows, err := db.Query(`SELECT seq, kind, idempotency_key, key_generated, execution_id, attempt, tool,
		effect, idempotent, input_hash, outcome, external_ref, result, error_code, error_message,
		retryable, lease_expires_at, ref_seq, actor, note, recorded_at, prev_hash, hash FROM receipts ORDER BY seq`)
	require.NoError(t, err)
	defer rows.Close()
	prev, n := chain.ZeroHash, uint64(0)
	for rows.Next() {
		var r chain.Receipt
		var ph, h []byte
		require.NoError(t, rows.Scan(&r.Seq, &r.Kind, &r.IdempotencyKey, &r.KeyGenerated, &r.ExecutionID, &r.Attempt,
			&r.Tool, &r.Effect, &r.Idempotent, &r.InputHash, &r.Outcome, &r.ExternalRef, &r.Result,
			&r.ErrorCode, &r.ErrorMessage, &r.Retryable, &r.LeaseExpiresAt, &r.RefSeq, &r.Actor,
			&r.Note, &r.RecordedAt, &ph, &h))
		n++
		require.Equal(t, n, r.Seq)
		require.Equal(t, prev[:], ph)
		got := r.ComputeHash(prev)
		require.Equal(t, got[:], h, "hash of %d", r.Seq)
		prev = got
	}
	require.NoError(t, rows.Err())
	assert.Equal(t, wantSeq, n)
	assert.Equal(t, wantHash, prev.String())
}

// TestLedgerd_restart stops ledgerd with SIGTERM (exit 0) and starts it
// again on the same file: state, head and outstanding reservations survive.
func TestLedgerd_restart(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ledger.db")
	l := StartLedgerd(t, path)
	token := l.Reserve(t, reserve("restart-key-1", "exec-1", 1, false))
	head := l.Do("GET", "/v1/head", "").Body
	require.NoError(t, l.Stop(), "exit 0 on SIGTERM:\n%s", l.Logs())
	assert.Contains(t, l.Logs(), "stopped")

	l = StartLedgerd(t, path)
	assert.Equal(t, head, l.Do("GET", "/v1/head", "").Body)
	r := l.Do("GET", "/v1/effects/restart-key-1", "")
	assert.Equal(t, "reserved", r.Body["state"])
	r = l.Do("POST", "/v1/effects/restart-key-1/commit", `{"reservation":"`+token+`","outcome":"succeeded"}`)
	require.Equal(t, 201, r.Status, r.Raw)
	require.NoError(t, l.Stop())
	checkFile(t, path, 2, r.Body["receipt"].(map[string]any)["hash"].(string))
}

// TestLedgerd_concurrent races 64 clients on one key and 64 clients on
// their own keys through HTTP.
func TestLedgerd_concurrent(t *testing.T) {
	t.Parallel()
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"))
	var wg sync.WaitGroup
	statuses := make([]int, 64)
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			statuses[i] = l.Do("POST", "/v1/effects/reserve", reserve("race-key-0001", fmt.Sprintf("exec-%d", i), 1, false)).Status
			k := fmt.Sprintf("own-key-%04d", i)
			r := l.Do("POST", "/v1/effects/reserve", reserve(k, "e", 1, false))
			if assert.Equal(t, 201, r.Status, r.Raw) {
				r = l.Do("POST", "/v1/effects/"+k+"/commit", `{"reservation":"`+r.Body["reservation"].(string)+`","outcome":"succeeded"}`)
				assert.Equal(t, 201, r.Status, r.Raw)
			}
		}()
	}
	wg.Wait()
	wins := 0
	for _, s := range statuses {
		if s == 201 {
			wins++
		} else {
			assert.Equal(t, 409, s)
		}
	}
	assert.Equal(t, 1, wins)
	h := l.Do("GET", "/v1/head", "").Body
	assert.Equal(t, float64(1+64*2), h["seq"])
	checkFile(t, l.DB, 129, h["hash"].(string))
}

func TestLedgerd_config(t *testing.T) {
	t.Run("ErrUnusableDB", func(t *testing.T) {
		db := filepath.Join(t.TempDir(), "missing", "dir", "l.db")
		out, code := runLedgerd(t, "--db", db, "--listen", "127.0.0.1:0")
		assert.Equal(t, 1, code)
		assert.Contains(t, out, "does not exist")
		assert.Contains(t, out, db, "the message names the database")
		assert.NotContains(t, out, ".lock", "not the lock file")
	})
	t.Run("ErrSecondWriter", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "ledger.db")
		l := StartLedgerd(t, path)
		out, err := exec.Command(filepath.Join(binDir, "ledgerd"), "--db", path, "--listen", "127.0.0.1:0").CombinedOutput()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee)
		assert.Equal(t, 1, ee.ExitCode())
		assert.Contains(t, string(out), "already open for writing by another process")
		assert.Contains(t, string(out), fmt.Sprintf("pid %d", l.cmd.Process.Pid))
		assert.Equal(t, 200, l.Do("GET", "/readyz", "").Status, "the first one is unaffected")
	})
	t.Run("ErrNotADatabase", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "junk.db")
		require.NoError(t, os.WriteFile(path, []byte(strings.Repeat("not sqlite ", 1000)), 0o600))
		out, code := runLedgerd(t, "--db", path, "--listen", "127.0.0.1:0")
		assert.Equal(t, 1, code)
		assert.Contains(t, out, "not a database")
	})
	t.Run("ErrBadFlag", func(t *testing.T) {
		out, code := runLedgerd(t, "--no-such-flag")
		assert.Equal(t, 2, code)
		assert.Contains(t, out, "no-such-flag")
	})
	t.Run("environment", func(t *testing.T) {
		// LEDGERD_DB picks the file; --listen on the command line wins over
		// a bad LEDGERD_LISTEN.
		path := filepath.Join(t.TempDir(), "env.db")
		t.Setenv("LEDGERD_DB", path)
		t.Setenv("LEDGERD_LISTEN", "256.0.0.1:1")
		l := StartLedgerd(t, path)
		assert.Contains(t, l.Logs(), "env.db")
		t.Setenv("LEDGERD_LOG_FORMAT", "yaml")
		out, code := runLedgerd(t)
		assert.Equal(t, 2, code)
		assert.Contains(t, out, "log-format")
	})
	t.Run("default file is created", func(t *testing.T) {
		dir := t.TempDir()
		cmd := exec.Command(filepath.Join(binDir, "ledgerd"), "--listen", "127.0.0.1:0")
		cmd.Dir = dir
		require.NoError(t, cmd.Start())
		require.Eventually(t, func() bool { _, err := os.Stat(filepath.Join(dir, "ledger.db")); return err == nil }, 60e9, 10e6)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
}
