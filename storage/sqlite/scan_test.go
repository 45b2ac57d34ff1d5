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
)

// driverKeys reads the keys table through database/sql, as Keys did
// before it stepped rows from C.
func driverKeys(t *testing.T, path string) ([]ledger.KeyRecord, error) {
	t.Helper()
	raw, err := sql.Open("sqlite3", path)
	require.NoError(t, err)
	defer raw.Close()
	rows, err := raw.Query(`SELECT idempotency_key, key_generated, tool, effect, input_hash, idempotent,
		first_seq, reserve_seq, lease_expires_at, final_seq FROM keys ORDER BY idempotency_key`)
	require.NoError(t, err)
	defer rows.Close()
	var out []ledger.KeyRecord
	for rows.Next() {
		var k ledger.KeyRecord
		if err := rows.Scan(&k.Key, &k.Generated, &k.Tool, &k.Effect, &k.InputHash, &k.Idempotent,
			&k.FirstSeq, &k.ReserveSeq, &k.LeaseExpiresAt, &k.FinalSeq); err != nil {
			return out, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// TestReader_keysOddValues checks that Keys reads an edited keys table as
// the driver does: values of another type that convert (a number as
// text, a blob key) come back converted, and one that does not fails the
// scan after the rows before it.
func TestReader_keysOddValues(t *testing.T) {
	ctx := context.Background()
	db, _ := MustOpenDB(t)
	path := db.Path()
	for i := range 20 {
		mustReserve(t, db, reserveReq(fmt.Sprintf("key-%04d", i), "exec-1"))
	}
	require.NoError(t, db.Close())
	edit := func(stmt string) {
		raw, err := sql.Open("sqlite3", path)
		require.NoError(t, err)
		defer raw.Close()
		_, err = raw.Exec(stmt)
		require.NoError(t, err)
	}
	read := func() ([]ledger.KeyRecord, error) {
		rd, err := sqlite.OpenReader(ctx, path, sqlite.Options{})
		require.NoError(t, err)
		defer rd.Close()
		var got []ledger.KeyRecord
		err = rd.Keys(ctx, func(k *ledger.KeyRecord) error { got = append(got, *k); return nil })
		return got, err
	}

	got, err := read()
	require.NoError(t, err)
	require.Len(t, got, 20)
	want, err := driverKeys(t, path)
	require.NoError(t, err)
	assert.Equal(t, want, got)

	edit(`UPDATE keys SET lease_expires_at = '123' WHERE idempotency_key = 'key-0005';
		UPDATE keys SET idempotency_key = CAST('key-0007' AS BLOB) WHERE idempotency_key = 'key-0007'`)
	got, err = read()
	require.NoError(t, err)
	want, err = driverKeys(t, path)
	require.NoError(t, err)
	assert.Equal(t, want, got)
	assert.Equal(t, uint64(123), got[5].LeaseExpiresAt)

	edit(`UPDATE keys SET key_generated = 'yes' WHERE idempotency_key = 'key-0009'`)
	got, err = read()
	require.Error(t, err)
	want, werr := driverKeys(t, path)
	require.Error(t, werr)
	assert.Equal(t, want, got, "the rows before the bad one")
}

// TestReader_receiptLargerThanBatch reads a receipt larger than the
// scan's batch buffer: the buffer grows for it.
func TestReader_receiptLargerThanBatch(t *testing.T) {
	ctx := context.Background()
	db, _ := MustOpenDB(t)
	path := db.Path()
	for i := range 3 {
		mustReserve(t, db, reserveReq(fmt.Sprintf("key-%04d", i), "exec-1"))
	}
	require.NoError(t, db.Close())
	big := strings.Repeat("n", 3<<20)
	raw, err := sql.Open("sqlite3", path)
	require.NoError(t, err)
	_, err = raw.Exec(`DROP TRIGGER receipts_no_update; UPDATE receipts SET note = ? WHERE seq = 2`, big)
	require.NoError(t, err)
	require.NoError(t, raw.Close())

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
