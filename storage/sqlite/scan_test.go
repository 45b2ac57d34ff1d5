package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

// TestReader_malformedRows edits a closed ledger the way sqlite3 can
// (SQLite is dynamically typed) and reads it back through every read
// path: no read fails, each bad value is listed in Malformed with its
// field zero, and the other fields are intact.
func TestReader_malformedRows(t *testing.T) {
	ctx := context.Background()
	db, path := openWithKeys(t, 6)
	rd, err := sqlite.OpenReader(ctx, path, sqlite.Options{})
	require.NoError(t, err)
	var want []chain.Receipt
	require.NoError(t, rd.Receipts(ctx, 0, func(r *chain.Receipt) error { want = append(want, *r); return nil }))
	require.NoError(t, rd.Close())
	require.NoError(t, db.Close())

	// A text attempt that mimics the packed form of a whole receipt: read
	// as packed text it would shift every field after it.
	mimic := "1,1,0,0,0,0,0,7:reserve8:key-0001"
	raw, err := sql.Open("sqlite3", path)
	require.NoError(t, err)
	raw.SetMaxOpenConns(1)
	_, err = raw.Exec(`DROP TRIGGER ns_receipts_no_update; PRAGMA ignore_check_constraints = ON;
		UPDATE ns_receipts SET attempt = 'a,b' || char(27) || '[2J' WHERE ns = 0 AND seq = 1;
		UPDATE ns_receipts SET attempt = -1, ref_seq = 1.5 WHERE ns = 0 AND seq = 2;
		UPDATE ns_receipts SET key_generated = 2 WHERE ns = 0 AND seq = 3;
		UPDATE ns_receipts SET prev_hash = x'00' WHERE ns = 0 AND seq = 4;
		UPDATE ns_receipts SET hash = zeroblob(40) WHERE ns = 0 AND seq = 5;
		UPDATE ns_receipts SET attempt = ? WHERE ns = 0 AND seq = 6;`, mimic)
	require.NoError(t, err)
	require.NoError(t, raw.Close())
	wantBad := map[uint64][]chain.Malformed{
		1: {{Field: "attempt", Value: `'a,b\x1b[2J'`}}, // no terminal escape gets through
		2: {{Field: "attempt", Value: "-1"}, {Field: "ref_seq", Value: "1.5"}},
		3: {{Field: "key_generated", Value: "2"}},
		4: {{Field: "prev_hash", Value: "X'00'"}},
		5: {{Field: "hash", Value: "X'" + strings.Repeat("00", 32) + "'…"}},
		6: {{Field: "attempt", Value: "'" + mimic + "'"}},
	}

	check := func(t *testing.T, got []chain.Receipt, full bool) {
		t.Helper()
		require.Len(t, got, len(want))
		for i, r := range got {
			w := want[i]
			var bad []chain.Malformed
			for _, m := range wantBad[r.Seq] {
				if full || m.Field != "prev_hash" && m.Field != "hash" { // the key-ordered scan reads no hashes
					bad = append(bad, m)
				}
			}
			assert.Equal(t, bad, r.Malformed, "seq %d", r.Seq)
			for _, m := range r.Malformed {
				switch m.Field {
				case "attempt":
					w.Attempt = 0
				case "ref_seq":
					w.RefSeq = 0
				case "key_generated":
					w.KeyGenerated = false
				case "prev_hash":
					w.PrevHash = chain.Hash{}
				case "hash":
					w.Hash = chain.Hash{}
				}
			}
			w.Malformed = bad
			if !full { // the key-ordered scan carries no hashes
				r.PrevHash, r.Hash, w.PrevHash, w.Hash = chain.Hash{}, chain.Hash{}, chain.Hash{}, chain.Hash{}
			}
			assert.Equal(t, w, r, "seq %d", r.Seq)
		}
	}
	rd, err = sqlite.OpenReader(ctx, path, sqlite.Options{})
	require.NoError(t, err)
	defer rd.Close()

	t.Run("Receipts", func(t *testing.T) {
		var got []chain.Receipt
		require.NoError(t, rd.Receipts(ctx, 0, func(r *chain.Receipt) error { got = append(got, *r); return nil }))
		check(t, got, true)
	})
	t.Run("KeyReceipts", func(t *testing.T) {
		var got []chain.Receipt
		require.NoError(t, rd.KeyReceipts(ctx, 0, func(r *chain.Receipt) error { got = append(got, *r); return nil }))
		check(t, got, false)
	})
	t.Run("ListReceipts", func(t *testing.T) {
		got, _, err := rd.ListReceipts(ctx, ledger.ReceiptFilter{})
		require.NoError(t, err)
		check(t, got, true)
	})
	t.Run("GetReceipt and GetKey", func(t *testing.T) {
		var got []chain.Receipt
		for seq := uint64(1); seq <= 6; seq++ {
			r, err := rd.GetReceipt(ctx, seq)
			require.NoError(t, err)
			got = append(got, *r)
		}
		check(t, got, true)
		v, err := rd.GetKey(ctx, "key-0002")
		require.NoError(t, err)
		require.Len(t, v.Receipts, 1)
		assert.Equal(t, wantBad[2], v.Receipts[0].Malformed)
	})
	t.Run("opened for writing", func(t *testing.T) {
		db := ledgertest.Open(t, ledgertest.WithPath(filepath.Clean(path)))
		r, err := db.GetReceipt(ctx, 3)
		require.NoError(t, err)
		assert.Equal(t, wantBad[3], r.Malformed)
	})
}
