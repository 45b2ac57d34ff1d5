package sqlite_test

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
	"github.com/effect-ledger/effect-ledger/testkit/storetest"
)

// BenchmarkDB_PairsPayloads is storetest.BenchPairsPayloads on SQLite, in
// an inline and a committed default namespace, in one process, on an
// empty ledger and on one of a million receipts (the generated inline
// ledger; committed switches it by policy first, SPEC §14):
//
//	go test -run XXX -bench PairsPayloads -count 5 ./storage/sqlite
//
// It adds the file's bytes per receipt (after a TRUNCATE checkpoint at
// close: values and salts included for committed).
func BenchmarkDB_PairsPayloads(b *testing.B) {
	for _, size := range []struct {
		name string
		n    int
	}{{"empty", 0}, {"prefilled", benchReceipts(b)}} {
		for _, mode := range storetest.PayloadsModes {
			b.Run(size.name+"/"+string(mode), func(b *testing.B) {
				path := benchLedger(b, size.n)
				opts := quiet
				opts.Payloads = mode
				db := ledgertest.Open(b, ledgertest.WithPath(path), ledgertest.WithStore(opts), ledgertest.WithNow(time.Now))
				defer db.Close()
				if size.n > 0 && mode == ledger.PayloadsCommitted {
					if _, err := db.SetPolicy(context.Background(), json.RawMessage(`{"payloads":"committed"}`), "bench"); err != nil {
						b.Fatal(err)
					}
				}
				before := db.Head().Seq
				storetest.BenchPairsPayloads(b, db.Namespace)
				head := db.Head()
				if err := db.Close(); err != nil {
					b.Fatal(err)
				}
				if fi, err := os.Stat(path); err == nil && head.Seq > 0 && before == 0 {
					b.ReportMetric(float64(fi.Size())/float64(head.Seq), "sqlite-bytes/receipt")
				}
			})
		}
	}
}
