package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/postgres"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/gen"
	"github.com/effect-ledger/effect-ledger/testkit/pgtest"
)

// BenchmarkUpdate measures one Update appending n reserves (with their
// key records and tree hashes) through the driver.
func BenchmarkUpdate(b *testing.B) {
	for _, tc := range []struct {
		n       int
		preload bool
	}{{1, false}, {16, false}, {256, false}, {16, true}, {256, true}} {
		n := tc.n
		name := fmt.Sprint(n)
		if tc.preload {
			name += "/preload"
		}
		b.Run(name, func(b *testing.B) {
			s := mustOpen(b, pgtest.URL(b), postgres.Options{})
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				var keys []string
				if tc.preload { // read with the head, in the first round trip
					for j := range n {
						keys = append(keys, fmt.Sprintf("key-%08d", i+j+1))
					}
				}
				err := s.Write(context.Background(), []ledger.Batch{{NS: ledger.DefaultNamespace, Keys: keys,
					Ops: []ledger.Op{ledger.OpFunc(func(ctx context.Context, tx ledger.Tx) error {
						for range n {
							i++
							if _, err := reserve(ctx, tx, call{key: fmt.Sprintf("key-%08d", i), exec: "e", tool: "t"}, 1000); err != nil {
								return err
							}
						}
						return nil
					})}}})
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/receipt")
		})
	}
}

// BenchmarkInsertReceipts compares the two ways of writing a batch's
// receipts: the unnest INSERT (which joins the pipelined batch) and COPY
// (its own round trips), each in a transaction of its own.
func BenchmarkInsertReceipts(b *testing.B) {
	for _, n := range []int{1, 16, 256} {
		for _, how := range []string{"copy", "unnest"} {
			b.Run(fmt.Sprintf("%s/%d", how, n), func(b *testing.B) {
				u := pgtest.URL(b)
				mustOpen(b, u, postgres.Options{}) // creates the schema
				ctx := context.Background()
				conn, err := pgx.Connect(ctx, u)
				if err != nil {
					b.Fatal(err)
				}
				defer conn.Close(ctx)
				// The bench table has receipts' columns without its checks and triggers.
				if _, err := conn.Exec(ctx, `CREATE TABLE bench (LIKE receipts INCLUDING DEFAULTS)`); err != nil {
					b.Fatal(err)
				}
				seq := int64(0)
				for b.Loop() {
					rows := make([][]any, n)
					cols := make([][]any, 24)
					for i := range rows {
						seq++
						rows[i] = []any{"default", seq, chain.KindReserve, fmt.Sprintf("key-%08d", seq), false, "exec", int64(1),
							"tool", chain.EffectWrite, false, "sha256:00", "", "", "", "", "", false, int64(1), int64(0), "", "", int64(1),
							make([]byte, 32), make([]byte, 32)}
						for j := range cols {
							cols[j] = append(cols[j], rows[i][j])
						}
					}
					tx, err := conn.Begin(ctx)
					if err != nil {
						b.Fatal(err)
					}
					if how == "copy" {
						_, err = tx.CopyFrom(ctx, pgx.Identifier{"bench"}, []string{"namespace", "seq", "kind", "idempotency_key",
							"key_generated", "execution_id", "attempt", "tool", "effect", "idempotent", "input_hash", "outcome",
							"external_ref", "result", "error_code", "error_message", "retryable", "lease_expires_at", "ref_seq",
							"actor", "note", "recorded_at", "prev_hash", "hash"}, pgx.CopyFromRows(rows))
					} else {
						_, err = tx.Exec(ctx, postgres.SQLInsertInto("bench"), postgres.Arrays(cols)...)
					}
					if err != nil {
						b.Fatal(err)
					}
					if err := tx.Commit(ctx); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/receipt")
			})
		}
	}
}

// BenchmarkLedger_Namespaces measures the domain on PostgreSQL with 32
// goroutines doing reserve+commit pairs of UUID-like keys, spread evenly
// over 1 or 16 namespaces, with ledgerd's default linger: the in-process
// form of scripts/bench --postgres --namespaces N (issue 31's goal: 16
// namespaces ≥ 0.9× one), without HTTP and without the load generator on
// the same two cores. The test cluster runs with fsync off, so this
// measures the CPU and the round trips, not the disk. It reports pairs/s.
func BenchmarkLedger_Namespaces(b *testing.B) {
	for _, nsCount := range []int{1, 16} {
		b.Run(fmt.Sprintf("ns-%d", nsCount), func(b *testing.B) {
			ctx := context.Background()
			l := ledger.New(mustOpen(b, pgtest.URL(b), postgres.Options{}), ledger.Config{Linger: 5 * time.Millisecond})
			b.Cleanup(func() { _ = l.Close() })
			nss := make([]*ledger.Namespace, nsCount)
			for i := range nss {
				name := ledger.DefaultNamespace
				if i > 0 {
					name = fmt.Sprintf("ns-%d", i+1)
					if err := l.CreateNamespace(ctx, name, ledger.NamespaceSettings{}); err != nil {
						b.Fatal(err)
					}
				}
				nss[i] = mustNS(b, l, name)
			}
			const clients = 32
			var next atomic.Uint64
			b.ResetTimer()
			var wg sync.WaitGroup
			for c := range clients {
				n := nss[c%nsCount]
				wg.Go(func() {
					for {
						i := next.Add(1)
						if i > uint64(b.N) {
							return
						}
						key := gen.UUIDLike("k", i)
						res, err := n.Reserve(ctx, testkit.ReserveReq(key, gen.UUIDLike("e", i)))
						if err == nil {
							_, err = n.Commit(ctx, testkit.Succeed(key, res.Reservation))
						}
						if err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
		})
	}
}
