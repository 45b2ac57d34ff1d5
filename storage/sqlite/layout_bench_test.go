package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// BenchmarkSQLite_Layout measures, with SQLite alone, what the layouts of
// docs/design/tenants.md §4 cost when 32 writes in flight are spread over 16
// namespaces (2 each, what 32 closed-loop clients give): every variant
// appends receipt-sized rows (one 400-byte row per receipt) with
// synchronous=FULL, and reports rows/s.
//
//   - "files-16": a file per namespace (today's layout), 16 writer
//     connections, each commits its namespace's 2 rows;
//   - "attached-10": one connection with 10 namespace files ATTACHed (SQLite's
//     compiled-in limit), one transaction writes 2 rows into each: every
//     attached WAL is still committed and synced, one after the other;
//   - "one-file": one file, one table with a namespace column, one
//     transaction writes all 32 rows.
func BenchmarkSQLite_Layout(b *testing.B) {
	row := make([]byte, 400)
	b.Run("files-16", func(b *testing.B) {
		dbs := make([]*sql.DB, 16)
		for i := range dbs {
			dbs[i] = layoutFile(b, filepath.Join(b.TempDir(), fmt.Sprintf("ns-%d.db", i)))
		}
		rounds := b.N/32 + 1
		b.ResetTimer()
		var wg sync.WaitGroup
		for _, db := range dbs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					layoutTx(b, db, func(tx *sql.Tx) {
						layoutInsert(b, tx, "rows", 0, row, 2)
					})
				}
			}()
		}
		wg.Wait()
		b.ReportMetric(float64(rounds*32)/b.Elapsed().Seconds(), "rows/s")
	})
	b.Run("attached-10", func(b *testing.B) {
		dir := b.TempDir()
		for i := range 10 {
			if err := layoutFile(b, filepath.Join(dir, fmt.Sprintf("ns-%d.db", i))).Close(); err != nil {
				b.Fatal(err)
			}
		}
		db := layoutFile(b, filepath.Join(dir, "main.db"))
		for i := range 10 {
			layoutExec(b, db, fmt.Sprintf(`ATTACH DATABASE '%s' AS ns%d`, filepath.Join(dir, fmt.Sprintf("ns-%d.db", i)), i))
			layoutExec(b, db, fmt.Sprintf(`PRAGMA ns%d.synchronous = FULL`, i))
		}
		rounds := b.N/20 + 1
		b.ResetTimer()
		for range rounds {
			layoutTx(b, db, func(tx *sql.Tx) {
				for i := range 10 {
					layoutInsert(b, tx, fmt.Sprintf("ns%d.rows", i), 0, row, 2)
				}
			})
		}
		b.ReportMetric(float64(rounds*20)/b.Elapsed().Seconds(), "rows/s")
	})
	b.Run("one-file", func(b *testing.B) {
		db := layoutFile(b, filepath.Join(b.TempDir(), "ledger.db"))
		rounds := b.N/32 + 1
		b.ResetTimer()
		for range rounds {
			layoutTx(b, db, func(tx *sql.Tx) {
				for ns := range 16 {
					layoutInsert(b, tx, "rows", ns, row, 2)
				}
			})
		}
		b.ReportMetric(float64(rounds*32)/b.Elapsed().Seconds(), "rows/s")
	})
}

func layoutFile(b *testing.B, path string) *sql.DB {
	b.Helper()
	db, err := sql.Open("sqlite3", "file:"+path+"?_journal_mode=WAL&_synchronous=FULL&_txlock=immediate")
	if err != nil {
		b.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	b.Cleanup(func() { _ = db.Close() })
	layoutExec(b, db, `CREATE TABLE rows (ns INTEGER NOT NULL, body BLOB NOT NULL)`)
	return db
}

func layoutExec(b *testing.B, db *sql.DB, q string) {
	b.Helper()
	if _, err := db.ExecContext(context.Background(), q); err != nil {
		b.Fatalf("%s: %v", q, err)
	}
}

func layoutTx(b *testing.B, db *sql.DB, fn func(*sql.Tx)) {
	tx, err := db.Begin()
	if err != nil {
		b.Error(err)
		return
	}
	fn(tx)
	if err := tx.Commit(); err != nil {
		b.Error(err)
	}
}

func layoutInsert(b *testing.B, tx *sql.Tx, table string, ns int, row []byte, n int) {
	q := "INSERT INTO " + table + " (ns, body) VALUES " + strings.TrimSuffix(strings.Repeat("(?, ?), ", n), ", ")
	args := make([]any, 0, 2*n)
	for range n {
		args = append(args, ns, row)
	}
	if _, err := tx.Exec(q, args...); err != nil {
		b.Error(err)
	}
}
