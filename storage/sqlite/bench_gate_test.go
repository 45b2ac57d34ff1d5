package sqlite_test

import (
	"context"
	"encoding/json"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit/gen"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

// BenchmarkGate measures what SPEC §13's gate costs, in one run: pairs
// (reserve, commit) in a namespace without a policy, the same pairs under
// a policy none of whose rules match the tool (the gate reads the key's
// receipts and the policy, then lets the reserve through), and the whole
// approved flow — reserve (202, an ask), an approver's answer, the
// reserve that consumes it, the commit — each with new UUID-like keys,
// with 1 client (the latency a person-free flow adds: ms/op) and 32, on
// an empty ledger and on one of a million receipts
// (LEDGER_BENCH_RECEIPTS).
func BenchmarkGate(b *testing.B) {
	sizes := []struct {
		name string
		n    int
	}{{"empty", 0}, {"prefilled", benchReceipts(b)}}
	flows := []struct {
		name, policy string
		approved     bool
	}{
		{"no-policy", "", false},
		{"policy-not-matching", `{"rules":[{"tool":"payments.*","approval":"required"},{"tool":"shell.*","deny":true}]}`, false},
		{"approve-consume", `{"rules":[{"tool":"bench.*","approval":"required"}],"self_approval":"allow"}`, true},
	}
	for _, size := range sizes {
		for _, clients := range []int{1, 32} {
			for _, flow := range flows {
				b.Run(size.name+"/"+strconv.Itoa(clients)+"-clients/"+flow.name, func(b *testing.B) {
					benchGate(b, benchLedger(b, size.n), clients, flow.policy, flow.approved)
				})
			}
		}
	}
}

func benchGate(b *testing.B, path string, clients int, policy string, approved bool) {
	db := ledgertest.Open(b, ledgertest.WithPath(path), ledgertest.WithNow(time.Now))
	defer db.Close()
	ctx := context.Background()
	if policy != "" {
		if _, err := db.SetPolicy(ctx, json.RawMessage(policy), "ops"); err != nil {
			b.Fatal(err)
		}
	}
	var seq atomic.Uint64
	salt := strconv.FormatInt(time.Now().UnixNano(), 10)
	b.SetParallelism((clients + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := seq.Add(1)
			k := gen.UUIDLike("gate-key-"+salt, i)
			req := ledger.ReserveRequest{IdempotencyKey: k, ExecutionID: gen.UUIDLike("gate-exec-"+salt, i),
				Tool: "bench.charge", Effect: "external", Input: json.RawMessage(`{"amount":1200,"order":` + strconv.FormatUint(i, 10) + `}`)}
			res, err := db.Reserve(ctx, req)
			if err != nil {
				b.Error(err)
				return
			}
			if approved {
				if res.Status != ledger.StatusApprovalRequired {
					b.Errorf("status %s, want approval_required", res.Status)
					return
				}
				if _, _, err := db.Answer(ctx, ledger.AnswerRequest{Seq: res.Ask.Seq, Decision: ledger.DecisionApprove}); err != nil {
					b.Error(err)
					return
				}
				if res, err = db.Reserve(ctx, req); err != nil {
					b.Error(err)
					return
				}
			}
			if _, err := db.Commit(ctx, ledger.CommitRequest{IdempotencyKey: k, Reservation: res.Reservation, Outcome: "succeeded"}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "flows/s")
	b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N)*float64(clients), "ms/flow")
}
