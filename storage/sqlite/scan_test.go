package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

// openWithKeys opens a ledger with the keys key-0001 … key-000n
// reserved by exec-1, and returns it with its file's path.
func openWithKeys(t *testing.T, n int) (*ledgertest.DB, string) {
	t.Helper()
	db := ledgertest.Open(t)
	for i := 1; i <= n; i++ {
		ledgertest.MustReserve(t, db, testkit.ReserveReq(fmt.Sprintf("key-%04d", i), "exec-1"))
	}
	return db, db.Path()
}

// execFile runs query with args on the closed ledger file at path, as
// sqlite3 would.
func execFile(t *testing.T, path, query string, args ...any) {
	t.Helper()
	raw, err := sql.Open("sqlite3", path)
	require.NoError(t, err)
	_, err = raw.Exec(query, args...)
	require.NoError(t, err)
	require.NoError(t, raw.Close())
}

// TestReader_keys: a file read without the writer lists no key records
// (their state is in the key index), unless its recorded head and its
// receipts differ, which is derived state gone wrong.
func TestReader_keys(t *testing.T) {
	ctx := context.Background()
	db, path := openWithKeys(t, 3)
	require.NoError(t, db.Close())
	keys := func() error {
		rd, err := sqlite.OpenReader(ctx, path, sqlite.Options{})
		require.NoError(t, err)
		defer rd.Close()
		return rd.Keys(ctx, func(*ledger.KeyRecord) error { t.Fatal("no records expected"); return nil })
	}
	require.ErrorIs(t, keys(), ledger.ErrNoKeyTable)
	execFile(t, path, `DROP TRIGGER ns_receipts_no_delete; DELETE FROM ns_receipts WHERE ns = 0 AND seq = 3`)
	err := keys()
	require.ErrorIs(t, err, ledger.ErrDerivedState)
	assert.Contains(t, err.Error(), "recorded head 3")
}

func TestReader_receiptLargerThanBatch(t *testing.T) {
	ctx := context.Background()
	db, path := openWithKeys(t, 3)
	require.NoError(t, db.Close())
	big := strings.Repeat("n", 3<<20)
	execFile(t, path, `DROP TRIGGER ns_receipts_no_update; UPDATE ns_receipts SET note = ? WHERE ns = 0 AND seq = 2`, big)

	rd, err := sqlite.OpenReader(ctx, path, sqlite.Options{})
	require.NoError(t, err)
	defer rd.Close()
	for name, scan := range map[string]func(context.Context, uint64, func(*chain.Receipt) error) error{
		"Receipts": rd.Receipts, "KeyReceipts": rd.KeyReceipts,
	} {
		var notes []int
		require.NoError(t, scan(ctx, 0, func(r *chain.Receipt) error { notes = append(notes, len(r.Note)); return nil }), name)
		assert.Equal(t, []int{0, len(big), 0}, notes, name)
	}
}

// TestReader_keysBesideWriter: a reader beside a running writer reads the recorded head and the
// receipts' tail in one snapshot, so appends between its reads are never taken for tampering.
func TestReader_keysBesideWriter(t *testing.T) {
	ctx := context.Background()
	db := ledgertest.Open(t)
	rd, err := sqlite.OpenReader(ctx, db.Path(), sqlite.Options{})
	require.NoError(t, err)
	defer rd.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 300 {
			ledgertest.MustReserve(t, db, testkit.ReserveReq(fmt.Sprintf("key-%06d", i), "exec-1"))
		}
	}()
	for checks := 0; ; checks++ {
		select {
		case <-done:
			require.Positive(t, checks)
			return
		default:
		}
		err := rd.Keys(ctx, func(*ledger.KeyRecord) error { return nil })
		require.ErrorIs(t, err, ledger.ErrNoKeyTable, "check %d", checks)
	}
}
