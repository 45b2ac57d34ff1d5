package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

// fill appends n reserve+commit pairs to db.
func fill(tb testing.TB, db *ledgertest.DB, prefix string, n int) {
	tb.Helper()
	for i := range n {
		key := fmt.Sprintf("%s-%06d", prefix, i)
		res := ledgertest.MustReserve(tb, db, testkit.ReserveReq(key, "exec-1"))
		_, err := db.Commit(context.Background(), testkit.Succeed(key, res.Reservation))
		require.NoError(tb, err)
	}
}

// dirEntries lists the names in dir.
func dirEntries(tb testing.TB, dir string) []string {
	tb.Helper()
	es, err := os.ReadDir(dir)
	require.NoError(tb, err)
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

// requireHead requires the ledger file at path to have head.
func requireHead(tb testing.TB, path string, head ledger.Head) {
	tb.Helper()
	rd, err := sqlite.OpenReader(context.Background(), path, sqlite.Options{})
	require.NoError(tb, err)
	defer rd.Close()
	h, err := rd.ReadHead(context.Background())
	require.NoError(tb, err)
	require.Equal(tb, head, h)
}

func TestBackup(t *testing.T) {
	ctx := context.Background()
	t.Run("OK the temporaries of a killed backup are removed, a running one's kept", func(t *testing.T) {
		db := ledgertest.Open(t)
		fill(t, db, "backup-sweep", 3)
		dir := t.TempDir()
		stale := filepath.Join(dir, ".copy.db.tmp-111")
		for _, f := range []string{stale, stale + "-journal"} {
			require.NoError(t, os.WriteFile(f, []byte("half a copy"), 0o600))
		}
		// A backup still running holds its temporary locked.
		running := filepath.Join(dir, ".copy.db.tmp-222")
		require.NoError(t, os.WriteFile(running, nil, 0o600))
		f, err := os.Open(running)
		require.NoError(t, err)
		defer f.Close()
		require.NoError(t, syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB))
		_, err = sqlite.Backup(ctx, db.Path(), filepath.Join(dir, "copy.db"), sqlite.BackupOptions{})
		require.NoError(t, err)
		require.Equal(t, []string{".copy.db.tmp-222", "copy.db"}, dirEntries(t, dir))
	})
	t.Run("OK", func(t *testing.T) {
		db := ledgertest.Open(t)
		fill(t, db, "backup-ok", 50)
		dir := t.TempDir()
		dst := filepath.Join(dir, "copy.db")
		var steps int
		res, err := sqlite.Backup(ctx, db.Path(), dst, sqlite.BackupOptions{PagesPerStep: 2,
			Progress: func(copied, total int) { steps++ }})
		require.NoError(t, err)
		require.Equal(t, db.Head(), res.Head, "nothing was written meanwhile")
		require.Equal(t, dst, res.Path)
		require.Greater(t, steps, 1, "copied in several steps")
		require.Equal(t, []string{"copy.db"}, dirEntries(t, dir), "no temporary file, journal or WAL is left")

		raw, err := os.ReadFile(dst)
		require.NoError(t, err)
		require.Equal(t, int64(len(raw)), res.Bytes)
		require.Equal(t, []byte{1, 1}, raw[18:20], "the copy uses a rollback journal: one self-contained file")

		requireHead(t, dst, res.Head)
	})
	t.Run("OK while the writer appends", func(t *testing.T) {
		db := ledgertest.Open(t)
		fill(t, db, "before", 200)
		var wg sync.WaitGroup
		var stop atomic.Bool
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				fill(t, db, fmt.Sprintf("during-%d", i), 1)
			}
		}()
		dst := filepath.Join(t.TempDir(), "copy.db")
		var first, last uint64
		res, err := sqlite.Backup(ctx, db.Path(), dst, sqlite.BackupOptions{PagesPerStep: 1,
			Progress: func(copied, total int) {
				if first == 0 {
					first = db.Head().Seq
				}
				last = db.Head().Seq
				time.Sleep(time.Millisecond) // a slow copy: the writer appends meanwhile
			}})
		stop.Store(true)
		wg.Wait()
		require.NoError(t, err)
		require.Greater(t, last, first, "receipts were appended during the copy")
		require.Less(t, res.Head.Seq, last, "the copy holds its snapshot, not the later receipts")
		require.GreaterOrEqual(t, res.Head.Seq, uint64(400))
		require.LessOrEqual(t, res.Head.Seq, db.Head().Seq)
		live, err := db.GetReceipt(ctx, res.Head.Seq)
		require.NoError(t, err)
		require.Equal(t, live.Hash, res.Head.Hash, "the copy is a prefix of the live chain")

		requireHead(t, dst, res.Head)
	})
	t.Run("ErrBackupExists", func(t *testing.T) {
		db := ledgertest.Open(t)
		fill(t, db, "exists", 3)
		dir := t.TempDir()
		dst := filepath.Join(dir, "copy.db")
		require.NoError(t, os.WriteFile(dst, []byte("keep me"), 0o600))
		_, err := sqlite.Backup(ctx, db.Path(), dst, sqlite.BackupOptions{})
		require.ErrorIs(t, err, sqlite.ErrBackupExists)
		raw, err := os.ReadFile(dst)
		require.NoError(t, err)
		require.Equal(t, "keep me", string(raw))
		require.Equal(t, []string{"copy.db"}, dirEntries(t, dir))

		res, err := sqlite.Backup(ctx, db.Path(), dst, sqlite.BackupOptions{Overwrite: true})
		require.NoError(t, err)
		require.Equal(t, db.Head(), res.Head)
	})
	t.Run("ErrNotLedger", func(t *testing.T) {
		dir := t.TempDir()
		other := filepath.Join(dir, "other.db")
		sdb, err := sql.Open("sqlite3", other)
		require.NoError(t, err)
		_, err = sdb.Exec(`CREATE TABLE t (x)`)
		require.NoError(t, err)
		require.NoError(t, sdb.Close())
		_, err = sqlite.Backup(ctx, other, filepath.Join(dir, "copy.db"), sqlite.BackupOptions{})
		require.ErrorIs(t, err, ledger.ErrNotLedger)
		require.Equal(t, []string{"other.db"}, dirEntries(t, dir))
	})
	t.Run("ErrCanceled", func(t *testing.T) {
		db := ledgertest.Open(t)
		fill(t, db, "cancel", 50)
		dir := t.TempDir()
		cctx, cancel := context.WithCancel(ctx)
		_, err := sqlite.Backup(cctx, db.Path(), filepath.Join(dir, "copy.db"), sqlite.BackupOptions{PagesPerStep: 1,
			Progress: func(int, int) { cancel() }})
		require.ErrorIs(t, err, context.Canceled)
		require.Empty(t, dirEntries(t, dir), "a canceled backup leaves nothing")
	})
	t.Run("ErrSameFile", func(t *testing.T) {
		db := ledgertest.Open(t)
		_, err := sqlite.Backup(ctx, db.Path(), db.Path(), sqlite.BackupOptions{Overwrite: true})
		require.Error(t, err)
	})
}
