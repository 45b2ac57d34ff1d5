package sqlite_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
	"github.com/effect-ledger/effect-ledger/testkit/storetest"
)

// BenchmarkDB_PairsPayloads is storetest.BenchPairsPayloads on SQLite, in
// an inline and a committed default namespace, in one process:
//
//	go test -run XXX -bench PairsPayloads -count 5 ./storage/sqlite
//
// It adds the file's bytes per receipt (after a TRUNCATE checkpoint at
// close: values and salts included for committed).
func BenchmarkDB_PairsPayloads(b *testing.B) {
	for _, mode := range storetest.PayloadsModes {
		b.Run(string(mode), func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "ledger.db")
			opts := quiet
			opts.Payloads = mode
			db := ledgertest.Open(b, ledgertest.WithPath(path), ledgertest.WithStore(opts), ledgertest.WithNow(time.Now))
			defer db.Close()
			storetest.BenchPairsPayloads(b, db.Namespace)
			head := db.Head()
			if err := db.Close(); err != nil {
				b.Fatal(err)
			}
			if fi, err := os.Stat(path); err == nil && head.Seq > 0 {
				b.ReportMetric(float64(fi.Size())/float64(head.Seq), "sqlite-bytes/receipt")
			}
		})
	}
}
