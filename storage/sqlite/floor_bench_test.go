package sqlite_test

import (
	"crypto/rand"
	"database/sql"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/effect-ledger/effect-ledger/testkit/gen"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

// BenchmarkSQLite_Floor measures what SQLite alone costs for the rows the
// writer writes, with none of the ledger's own work (no decisions, no
// canonical JSON, no hashing, no key cache, no Go batching queue): one
// connection, prepared statements, BEGIN IMMEDIATE … COMMIT with
// synchronous=FULL, batches of 16 receipts (what 32 closed-loop clients
// give the writer), half of each batch reserves of new UUID-like keys and
// executions, half the commits of the previous batch's reserves. Per
// receipt: one receipts row (23 columns, the linking and head triggers,
// four indexes), the keys row written (insert at reserve, replace at
// commit) and two tree_hashes rows. WAL checkpoints are off for the run (in
// ledgerd they run on another connection), so frames/receipt is the WAL
// the writer itself writes.
//
// The variants take parts away, on a copy of the same file, to show what
// each costs: "no-random-indexes" drops receipts_by_key and
// receipts_by_execution, "no-keys" skips the keys rows, "append-only" does
// both, "append-only-nosync" also commits without fsync. The receipts/s
// of the full variant is the most the writer could do on this machine
// with this schema if the rest of its work were free.
func BenchmarkSQLite_Floor(b *testing.B) {
	variants := []struct {
		name                    string
		dropRandom, noKeys, off bool
	}{
		{"schema", false, false, false},
		{"no-random-indexes", true, false, false},
		{"no-keys", false, true, false},
		{"append-only", true, true, false},
		{"append-only-nosync", true, true, true},
	}
	for _, size := range []struct {
		name string
		n    int
	}{{"empty", 0}, {"prefilled", benchReceipts(b)}} {
		for _, v := range variants {
			b.Run(size.name+"/"+v.name, func(b *testing.B) {
				path := benchLedger(b, size.n)
				db := ledgertest.Open(b, ledgertest.WithPath(path)) // the schema, for a new file
				if err := db.Close(); err != nil {
					b.Fatal(err)
				}
				floorRun(b, path, v.dropRandom, v.noKeys, v.off)
			})
		}
	}
}

func floorRun(b *testing.B, path string, dropRandom, noKeys, noSync bool) {
	sync := "FULL"
	if noSync {
		sync = "OFF"
	}
	w, err := sql.Open("sqlite3", "file:"+path+"?_journal_mode=WAL&_txlock=immediate&_cache_size=-65536&_synchronous="+sync)
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	w.SetMaxOpenConns(1)
	exec := func(q string, args ...any) {
		if _, err := w.Exec(q, args...); err != nil {
			b.Fatalf("%s: %v", q, err)
		}
	}
	exec(`PRAGMA wal_checkpoint(TRUNCATE)`)
	exec(`PRAGMA wal_autocheckpoint = 0`)
	if dropRandom {
		exec(`DROP INDEX receipts_by_key`)
		exec(`DROP INDEX receipts_by_execution`)
		exec(`PRAGMA wal_checkpoint(TRUNCATE)`)
	}
	var seq, treeIdx int64
	prev := make([]byte, 32)
	if err := w.QueryRow(`SELECT seq, hash FROM head`).Scan(&seq, &prev); err != nil {
		b.Fatal(err)
	}
	if err := w.QueryRow(`SELECT coalesce(max(idx) + 1, 0) FROM tree_hashes`).Scan(&treeIdx); err != nil {
		b.Fatal(err)
	}
	prepare := func(q string) *sql.Stmt {
		st, err := w.Prepare(q)
		if err != nil {
			b.Fatal(err)
		}
		return st
	}
	insert := prepare(`INSERT INTO receipts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)
	putKey := prepare(`INSERT OR REPLACE INTO keys VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)
	tree := prepare(`INSERT INTO tree_hashes (idx, hash) VALUES (?, ?)`)

	const batch = 16
	salt := time.Now().Format(time.RFC3339Nano)
	inputHash := "sha256:" + strings.Repeat("5e", 32)
	var pending []uint64 // pairs reserved by earlier batches, not yet committed
	var n uint64
	walBefore := fileSize(path + "-wal")
	b.ResetTimer()
	for done := 0; done < b.N; {
		tx, err := w.Begin()
		if err != nil {
			b.Fatal(err)
		}
		ins, put, tr := tx.Stmt(insert), tx.Stmt(putKey), tx.Stmt(tree)
		var reserved []uint64
		for i := 0; i < batch && done < b.N; i, done = i+1, done+1 {
			seq++
			hash := make([]byte, 32)
			_, _ = rand.Read(hash)
			kind, pair := "reserve", uint64(0)
			if len(pending) > 0 && i%2 == 1 {
				kind, pair, pending = "commit", pending[0], pending[1:]
			} else {
				n++
				pair = n
				reserved = append(reserved, pair)
			}
			key := gen.UUIDLike("floor-key-"+salt, pair)
			if _, err := ins.Exec(seq, kind, key, 0, gen.UUIDLike("floor-exec-"+salt, pair), 1, "payments.refund",
				"write", 1, inputHash, "", "", `{"refund":"r_1"}`, "", "", 0, 1700000030000, 0, "", "",
				1700000000000, prev, hash); err != nil {
				b.Fatal(err)
			}
			prev = hash
			if !noKeys {
				if _, err := put.Exec(key, 0, "payments.refund", "write", inputHash, 1, seq, seq,
					1700000030000, 0, hash); err != nil {
					b.Fatal(err)
				}
			}
			for range 2 {
				if _, err := tr.Exec(treeIdx, hash); err != nil {
					b.Fatal(err)
				}
				treeIdx++
			}
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
		pending = append(pending, reserved...)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "receipts/s")
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/receipt")
	frames := float64(fileSize(path+"-wal")-walBefore) / float64(4096+24)
	b.ReportMetric(frames/float64(b.N), "frames/receipt")
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}
