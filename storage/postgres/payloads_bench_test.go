package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/postgres"
	"github.com/effect-ledger/effect-ledger/testkit/pgtest"
	"github.com/effect-ledger/effect-ledger/testkit/storetest"
)

// BenchmarkLedger_PairsPayloads is storetest.BenchPairsPayloads on
// PostgreSQL, in an inline and a committed default namespace, in one
// process, with ledgerd's default linger:
//
//	go test -run XXX -bench PairsPayloads -count 5 ./storage/postgres
//
// It adds the bytes the database's tables, indexes and TOAST take per
// receipt (pg_total_relation_size, after a VACUUM so that dead row
// versions of updated key records do not count).
func BenchmarkLedger_PairsPayloads(b *testing.B) {
	for _, mode := range storetest.PayloadsModes {
		b.Run(string(mode), func(b *testing.B) {
			url := pgtest.URL(b)
			l := ledger.New(mustOpen(b, url, postgres.Options{Payloads: mode}), ledger.Config{Linger: 5 * time.Millisecond})
			defer l.Close()
			n := mustNS(b, l, ledger.DefaultNamespace)
			storetest.BenchPairsPayloads(b, n)
			ctx := context.Background()
			head, err := n.Head(ctx)
			if err != nil {
				b.Fatal(err)
			}
			conn := connect(b, url)
			var bytes int64
			if _, err := conn.Exec(ctx, "VACUUM"); err != nil {
				b.Fatal(err)
			}
			if err := conn.QueryRow(ctx, `SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint
				FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
				WHERE c.relkind IN ('r', 'm') AND s.nspname NOT IN ('pg_catalog', 'information_schema')
				AND s.nspname NOT LIKE 'pg_toast%'`).Scan(&bytes); err != nil {
				b.Fatal(err)
			}
			if head.Seq > 0 {
				b.ReportMetric(float64(bytes)/float64(head.Seq), "pg-bytes/receipt")
			}
		})
	}
}
