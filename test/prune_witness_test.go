package test

import (
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/mod/sumdb/note"

	"github.com/effect-ledger/effect-ledger/testkit/testwitness"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// TestPrune_witness: a witness that cosigned checkpoints before a prune
// (SPEC §16) goes on cosigning after it: the consistency proofs it asks
// ledgerd for read subtrees over the deleted bodies, recomputed from the
// kept hashes, and verify against what it saw before.
func TestPrune_witness(t *testing.T) {
	t.Parallel()
	clock := newTestClock(t, t0)
	dir := t.TempDir()
	key, vkey := keygen(t, dir, "ex.test")
	w, err := testwitness.New("w1.test", vkey, "ex.test/wit")
	require.NoError(t, err)
	srv := httptest.NewServer(w)
	t.Cleanup(srv.Close)
	l := clock.start(t, filepath.Join(dir, "ledger.db"), "--signing-key", key, "--log-origin", "ex.test",
		"--checkpoint-interval", "20ms", "--archive-dir", t.TempDir(), "--prune-interval", "0",
		"--witness", w.VerifierKey()+"="+srv.URL, "--witness-quorum", "1")
	require.Equal(t, 201, l.Do("POST", "/v1/namespaces", `{"name":"wit","key_ttl_ms":60000}`).Status)
	require.Equal(t, 200, l.Do("PUT", "/v1/namespaces/wit/policy", `{"archive":{"keep_ms":60000,"min_keep_ms":60000}}`).Status)
	appendPairs(t, l, "/v1/ns/wit", "before", 300) // 2 … 601
	cosigned := func(size int64) tlog.Checkpoint {
		t.Helper()
		cv, err := tlog.NewCosignatureVerifier(w.VerifierKey())
		require.NoError(t, err)
		deadline := time.Now().Add(60 * time.Second)
		for {
			raw, c := waitCheckpointNS(t, l, vkey, "wit", size)
			if tlog.CountCosigners([]byte(raw), []note.Verifier{cv}) == 1 && w.Size("ex.test/wit") >= c.Size {
				return c
			}
			require.True(t, time.Now().Before(deadline), "checkpoint %d not cosigned in 60s:\n%s", size, l.Logs())
			time.Sleep(20 * time.Millisecond)
		}
	}
	first := cosigned(601)

	clock.advance(3 * time.Minute)
	r := l.Do("POST", "/v1/ns/wit/effects/reserve", `{"idempotency_key":"open-0000001","execution_id":"e1","tool":"mail.send","effect":"write"}`)
	require.Equal(t, 201, r.Status, r.Raw) // 602: pins
	cosigned(602)
	r = l.Do("POST", "/v1/ns/wit/prune", `{}`)
	require.Equal(t, 201, r.Status, r.Raw)
	require.Equal(t, float64(601), r.Body["through"])
	require.Eventually(t, func() bool {
		st := l.Do("GET", "/v1/ns/wit/prune", "")
		return st.Status == 200 && st.Body["kept_through"] == float64(601)
	}, 30*time.Second, 20*time.Millisecond, "the bodies are deleted")
	require.Equal(t, 410, l.Do("GET", "/v1/ns/wit/receipts/300", "").Status)

	appendPairs(t, l, "/v1/ns/wit", "after", 40) // 604 … 683
	after := cosigned(683)
	require.Greater(t, after.Size, first.Size)
	require.Zero(t, w.Requests(422)+w.Requests(400)+w.Requests(403), "every consistency proof verified, across the pruned subtrees too")
}
