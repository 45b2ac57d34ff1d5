package test

import (
	"bufio"
	"database/sql"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
)

// growV6 appends n reserves to the default chain of the schema 6 ledger
// at db, linked as ledgerd links them, in one transaction.
func growV6(t *testing.T, db string, n int) uint64 {
	t.Helper()
	sdb, err := sql.Open("sqlite3", "file:"+db)
	require.NoError(t, err)
	defer sdb.Close()
	sdb.SetMaxOpenConns(1)
	tx, err := sdb.Begin()
	require.NoError(t, err)
	var head chain.Receipt
	var hash []byte
	require.NoError(t, tx.QueryRow(`SELECT seq, hash, recorded_at FROM receipts ORDER BY seq DESC LIMIT 1`).Scan(&head.Seq, &hash, &head.RecordedAt))
	copy(head.Hash[:], hash)
	st, err := tx.Prepare(`INSERT INTO receipts (seq, kind, idempotency_key, key_generated, execution_id, attempt, tool,
		effect, idempotent, input_hash, outcome, external_ref, result, error_code, error_message, retryable,
		lease_expires_at, ref_seq, actor, note, recorded_at, prev_hash, hash)
		VALUES (?, 'reserve', ?, 0, 'exec-grow', 1, 'mail.send', 'external', 0, ?, '', '', '', '', '', 0, ?, 0, '', '', ?, ?, ?)`)
	require.NoError(t, err)
	for i := range n {
		at := head.RecordedAt + 1
		r := chain.Link(head.Seq, head.Hash, chain.Receipt{Kind: chain.KindReserve, IdempotencyKey: fmt.Sprintf("grow-%07d", i),
			ExecutionID: "exec-grow", Attempt: 1, Tool: "mail.send", Effect: chain.EffectExternal,
			InputHash: "sha256:" + strings.Repeat("ab", 32), LeaseExpiresAt: at + 30_000, RecordedAt: at})
		_, err := st.Exec(r.Seq, r.IdempotencyKey, r.InputHash, r.LeaseExpiresAt, r.RecordedAt, r.PrevHash[:], r.Hash[:])
		require.NoError(t, err)
		head = r
	}
	require.NoError(t, st.Close())
	require.NoError(t, tx.Commit())
	return head.Seq
}

// TestLedgerd_migrationKilled: ledgerd killed with SIGKILL at moments
// while it migrates a ledger of schema 6 in place (the default namespace
// moves into the shared tables) leaves the file as it was or migrated,
// never between; a later start serves it whole: every receipt, the
// reservation left open before the migration committing with its token,
// the chain verifying.
func TestLedgerd_migrationKilled(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "ledger.db")
	testkit.CopyFile(t, "../storage/sqlite/testdata/v6.db", db)
	want := growV6(t, db, 40_000)

	for _, delay := range []time.Duration{0, 2 * time.Millisecond, 10 * time.Millisecond, 40 * time.Millisecond, 150 * time.Millisecond} {
		cmd := exec.Command(filepath.Join(binDir, "ledgerd"), "--db", db, "--listen", "127.0.0.1:0", "--log-format", "json")
		stderr, err := cmd.StderrPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		migrating := make(chan struct{})
		go func() {
			sc := bufio.NewScanner(stderr)
			once := false
			for sc.Scan() {
				if !once && (strings.Contains(sc.Text(), "migrating ledger database") || strings.Contains(sc.Text(), "ledger opened")) {
					once = true
					close(migrating)
				}
			}
			if !once {
				close(migrating)
			}
		}()
		<-migrating
		time.Sleep(delay)
		require.NoError(t, cmd.Process.Kill())
		_ = cmd.Wait()

		// As it was, or migrated: never between.
		sdb, err := sql.Open("sqlite3", "file:"+db+"?mode=ro")
		require.NoError(t, err)
		var version int
		require.NoError(t, sdb.QueryRow(`PRAGMA user_version`).Scan(&version))
		var n uint64
		require.NoError(t, sdb.QueryRow(`SELECT count(*) FROM receipts`).Scan(&n))
		require.NoError(t, sdb.Close())
		assert.Contains(t, []int{6, sqlite.SchemaVersion}, version, "killed after %s", delay)
		assert.Equal(t, want, n, "killed after %s at version %d: every receipt of the default chain", delay, version)
	}

	l := StartLedgerd(t, db)
	l.Commit(t, "default-open-0001", testkit.CommitBody("rsv_5a295254c4f9e154832792dbd3c758104db97634f1e7cb4f8f7a5160ac10e94b", "succeeded", ""))
	r := l.Do("GET", "/v1/effects/grow-0039999", "")
	require.Equal(t, 200, r.Status, r.Raw)
	require.NoError(t, l.Stop())
	verified(t, db)
}
