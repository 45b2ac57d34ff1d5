package test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/verify"
)

// outcome is what a client saw for one request.
type outcome struct {
	status  int
	code    string
	kind    string // receipt kind a 2xx claims
	seq     float64
	hash    string
	key     string
	success bool // a commit of outcome succeeded
}

// TestLedgerd_batchingMatchesStateMachine races mixed reserves, commits
// (right and stale tokens, successes and retryable failures) and replays
// on a few overlapping keys through HTTP, so that the writer batches
// them. Then the sequential state machine (the verifier's replay of SPEC
// §3–4) must accept the chain as written, every receipt a client was told
// about must be in it with that hash, the derived keys table must agree,
// and each key has at most one success.
func TestLedgerd_batchingMatchesStateMachine(t *testing.T) {
	t.Parallel()
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"))
	var keys []string
	for i := range 48 {
		keys = append(keys, fmt.Sprintf("overlap-key-%02d", i))
	}
	var mu sync.Mutex
	var seen []outcome
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			var tokens []string
			attempt := map[string]int{}
			for i := range 40 {
				key := keys[rng.IntN(len(keys))]
				exec := fmt.Sprintf("exec-%d", g)
				var o outcome
				if len(tokens) > 0 && rng.IntN(2) == 0 {
					tok := tokens[rng.IntN(len(tokens))]
					body := `{"reservation":"` + tok + `","outcome":"succeeded","external_ref":"ref-` + fmt.Sprint(g) + `"}`
					if rng.IntN(4) != 0 {
						body = `{"reservation":"` + tok + `","outcome":"failed","error":{"code":"TIMEOUT","retryable":true}}`
					}
					r := l.Do("POST", "/v1/effects/"+key+"/commit", body)
					o = outcome{status: r.Status, code: r.Code(), kind: chain.KindCommit, key: key}
					if r.Status == 201 {
						o.success = r.Body["outcome"] == "succeeded"
					}
					if rc, ok := r.Body["receipt"].(map[string]any); ok {
						o.seq, o.hash = rc["seq"].(float64), rc["hash"].(string)
					}
				} else {
					attempt[key]++
					body := fmt.Sprintf(`{"idempotency_key":%q,"execution_id":%q,"attempt":%d,"tool":"t.x","effect":"write","idempotent":true,"lease_ms":%d}`,
						key, exec, attempt[key], 50+rng.IntN(200))
					r := l.Do("POST", "/v1/effects/reserve", body)
					o = outcome{status: r.Status, code: r.Code(), key: key}
					switch r.Status {
					case 201:
						o.kind = chain.KindReserve
						tokens = append(tokens, r.Body["reservation"].(string))
					case 200:
						o.kind = chain.KindReplay
					}
					if rc, ok := r.Body["receipt"].(map[string]any); ok {
						o.seq, o.hash = rc["seq"].(float64), rc["hash"].(string)
					}
				}
				if i%10 == 0 {
					time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
				}
				mu.Lock()
				seen = append(seen, o)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	require.NoError(t, l.Stop())

	rd, err := sqlite.OpenReader(context.Background(), l.DB, sqlite.Options{})
	require.NoError(t, err)
	defer rd.Close()
	rep, err := verify.New(rd, verify.Opts{}).Check(context.Background())
	require.NoError(t, err)
	require.True(t, rep.OK, "the chain breaks the state machine: %+v", rep.Violations)

	successes := map[string]int{}
	statuses := map[int]int{}
	for _, o := range seen {
		statuses[o.status]++
		switch o.status {
		case 200, 201:
			require.NotZero(t, o.seq, "%+v", o)
			r, err := rd.GetReceipt(context.Background(), uint64(o.seq))
			require.NoError(t, err)
			assert.Equal(t, o.hash, r.Hash.String(), "acknowledged receipt %d", r.Seq)
			assert.Equal(t, o.key, r.IdempotencyKey)
			if o.status == 201 || o.kind == chain.KindReplay {
				assert.Equal(t, o.kind, r.Kind)
			}
			if o.status == 201 && o.success {
				successes[o.key]++
			}
		case 409, 404, 422:
			assert.Contains(t, []string{"in_progress", "stale_reservation", "already_finalized", "attempt_conflict",
				"retry_not_allowed", "unsafe_resume", "unknown_key"}, o.code, "%+v", o)
		default:
			t.Errorf("unexpected status %d (%s)", o.status, o.code)
		}
	}
	for k, n := range successes {
		assert.LessOrEqual(t, n, 1, "key %s succeeded %d times", k, n)
	}
	t.Logf("statuses: %v, receipts: %d", statuses, rep.Receipts)
}
