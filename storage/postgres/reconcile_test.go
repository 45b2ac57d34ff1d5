package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/postgres"
	"github.com/effect-ledger/effect-ledger/testkit/pgtest"
)

// sideTables counts the side tables of schema 4 that dbURL has.
func sideTables(tb testing.TB, dbURL string) int {
	tb.Helper()
	return queryInt(tb, dbURL, `SELECT (to_regclass('subjects') IS NOT NULL)::int + (to_regclass('subjects_by_key') IS NOT NULL)::int
		+ (to_regclass('pending_erasures') IS NOT NULL)::int + (to_regclass('reconciled_tokens') IS NOT NULL)::int
		+ (to_regclass('erasure_subjects') IS NOT NULL)::int`)
}

// TestOpen_addsSideTables: a database of schema 4 made before the side
// tables that schema gained (the subject index, the pending erasure
// marks, the tokens of reconciled reservations) is read as it is by a
// read-only store and gets them when a writer opens it; the token of a
// reconciled reservation is then kept and found by its key and hash
// (SPEC §15: the original call's late commit after the key's rerun), in
// its own transaction too, and across a reopening.
func TestOpen_addsSideTables(t *testing.T) {
	t.Parallel()
	u := pgtest.URL(t)
	_ = mustOpen(t, u, postgres.Options{Logger: quiet}).Close()
	if n := sideTables(t, u); n != 5 {
		t.Fatalf("a new database has %d of the 5 side tables and index", n)
	}
	psql(t, u, `DROP TABLE subjects, pending_erasures, reconciled_tokens, erasure_subjects`)
	_ = mustOpen(t, u, postgres.Options{Logger: quiet, ReadOnly: true}).Close()
	if n := sideTables(t, u); n != 0 {
		t.Fatalf("a read-only store made %d side tables", n)
	}
	_, c := mustOpenDefault(t, u, postgres.Options{Logger: quiet})
	if n, v := sideTables(t, u), schemaVersion(t, u); n != 5 || v != postgres.SchemaVersion {
		t.Fatalf("after a writer opened it: %d side tables and index, schema %d", n, v)
	}
	hash, other := strings.Repeat("a", 32), strings.Repeat("b", 32)
	find := func(ctx context.Context, tx ledger.Tx, key, h string, want uint64) error {
		seq, err := tx.ReconciledReserve(ctx, key, h)
		if err == nil && seq != want {
			err = fmt.Errorf("ReconciledReserve(%s, %.1s…) = %d, want %d", key, h, seq, want)
		}
		return err
	}
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		if err := reserveKey(ctx, tx, "key-00001", "e1"); err != nil {
			return err
		}
		if err := tx.PutReconciledToken(ctx, "key-00001", hash, 1); err != nil {
			return err
		}
		return find(ctx, tx, "key-00001", hash, 1)
	})
	check := func(c ledger.Chain) {
		t.Helper()
		update(t, c, func(ctx context.Context, tx ledger.Tx) error {
			for _, f := range []struct {
				key, hash string
				want      uint64
			}{{"key-00001", hash, 1}, {"key-00001", other, 0}, {"key-00002", hash, 0}} {
				if err := find(ctx, tx, f.key, f.hash, f.want); err != nil {
					return err
				}
			}
			return nil
		})
	}
	check(c)
	_, again := mustOpenDefault(t, u, postgres.Options{Logger: quiet})
	check(again)
}
