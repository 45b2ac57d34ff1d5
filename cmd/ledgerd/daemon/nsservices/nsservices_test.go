package nsservices_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/mod/sumdb/note"

	"github.com/effect-ledger/effect-ledger/cmd/ledgerd/daemon/nsservices"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// origin is the log origin prefix of the tests' key.
const origin = "ledger.example.com"

// newConfig opens a ledger with one receipt in the default namespace and
// returns a Config signing its checkpoints every second, looking for new
// namespaces every 2 s.
func newConfig(t *testing.T) (nsservices.Config, *ledgertest.DB) {
	t.Helper()
	db := ledgertest.Open(t)
	ledgertest.MustReserve(t, db, testkit.ReserveReq("key-default-1", "exec-1"))
	skey, vkey, err := tlog.GenerateKey(origin)
	require.NoError(t, err)
	signer, _, _, err := tlog.LoadSignerText(skey, origin)
	require.NoError(t, err)
	return nsservices.Config{Ledger: db.Ledger, Logger: ledgertest.Quiet, Signers: []note.Signer{signer}, VerifierKeys: []string{vkey},
		OriginPrefix: origin, CheckpointInterval: time.Second, ScanEvery: 2 * time.Second}, db
}

// checkpointSize is the size of namespace ns's latest checkpoint, 0 if
// none.
func checkpointSize(t *testing.T, db *ledgertest.DB, ns string) int64 {
	t.Helper()
	n, err := db.Ledger.NS(context.Background(), ns)
	require.NoError(t, err)
	c, err := n.LatestCheckpoint(context.Background())
	require.NoError(t, err)
	if c == nil {
		return 0
	}
	return c.Size
}

// TestStart_OK: the namespaces there are get their signer at Start; one
// created later gets its own at the next scan, not before.
func TestStart_OK(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg, db := newConfig(t)
		s, err := nsservices.Start(t.Context(), cfg)
		require.NoError(t, err)
		defer s.Stop()
		synctest.Wait()
		assert.Equal(t, int64(1), checkpointSize(t, db, ledger.DefaultNamespace), "signed at start")

		require.NoError(t, db.Ledger.CreateNamespace(t.Context(), "pay", ledger.NamespaceSettings{}))
		pay, err := db.Ledger.NS(t.Context(), "pay")
		require.NoError(t, err)
		_, err = pay.Reserve(t.Context(), testkit.ReserveReq("key-pay-1", "exec-2"))
		require.NoError(t, err)
		time.Sleep(time.Second)
		synctest.Wait()
		assert.Zero(t, checkpointSize(t, db, "pay"), "not seen before the next scan")

		time.Sleep(cfg.ScanEvery - time.Second)
		synctest.Wait()
		assert.Equal(t, int64(1), checkpointSize(t, db, "pay"), "signed once the scan has seen it")
	})
}

// TestStart_verification: with a verification store each namespace is
// verified at once, then every VerifyEvery.
func TestStart_verification(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg, db := newConfig(t)
		cfg.Signers = nil
		cfg.VerifyStore, cfg.VerifyEvery, cfg.Registerer = db.Store, time.Minute, prometheus.NewRegistry()
		s, err := nsservices.Start(t.Context(), cfg)
		require.NoError(t, err)
		defer s.Stop()
		synctest.Wait()
		p := s.Verification(ledger.DefaultNamespace)
		require.NotNil(t, p)
		first := p.Status().Last
		require.NotNil(t, first, "a run at start")
		require.NotNil(t, first.Report, "%v", first.Err)
		assert.True(t, first.Report.OK, "%+v", first.Report.Violations)
		assert.Nil(t, s.Verification("pay"), "no such namespace")
		assert.Nil(t, s.Served(ledger.DefaultNamespace), "no witnesses")
		assert.Equal(t, int64(0), checkpointSize(t, db, ledger.DefaultNamespace), "no signer")

		time.Sleep(time.Minute)
		synctest.Wait()
		assert.True(t, p.Status().Last.Started.After(first.Started), "run again after VerifyEvery")
	})
}

// lock is a fake signer lock that another replica holds until given up.
type lock struct {
	mu       sync.Mutex
	taken    bool // by another replica
	tries    int
	released int
}

func (l *lock) try(_ context.Context, ns string) (func(), bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.tries++
	if l.taken {
		return nil, false, nil
	}
	l.taken = true
	return func() { l.mu.Lock(); defer l.mu.Unlock(); l.released++ }, true, nil
}

// TestStart_signerElection: a replica signs only once it holds the
// namespace's lock, asks for it at each tick until then, keeps it, and
// gives it up at Stop.
func TestStart_signerElection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg, db := newConfig(t)
		l := &lock{taken: true}
		cfg.SignerLock = l.try
		s, err := nsservices.Start(t.Context(), cfg)
		require.NoError(t, err)
		synctest.Wait()
		assert.Zero(t, checkpointSize(t, db, ledger.DefaultNamespace), "another replica signs")

		l.mu.Lock()
		l.taken = false // the other replica went away
		l.mu.Unlock()
		time.Sleep(cfg.CheckpointInterval)
		synctest.Wait()
		assert.Equal(t, int64(1), checkpointSize(t, db, ledger.DefaultNamespace), "signs once elected")

		time.Sleep(5 * cfg.CheckpointInterval)
		synctest.Wait()
		s.Stop()
		l.mu.Lock()
		defer l.mu.Unlock()
		assert.Equal(t, 2, l.tries, "the lock is kept once held")
		assert.Equal(t, 1, l.released, "given up at Stop")
	})
}

// TestStart_ErrWitnessKey: a verifier key the witnessing cannot parse
// stops Start.
func TestStart_ErrWitnessKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg, _ := newConfig(t)
		cfg.Witnesses, cfg.VerifierKeys = []*tlog.Witness{{URL: "http://127.0.0.1:1"}}, []string{"not a key"}
		_, err := nsservices.Start(t.Context(), cfg)
		assert.ErrorContains(t, err, "witness:")
	})
}

// payloadBytes is the ledger_payload_bytes gauge of namespace ns on the
// default registry, or -1 when it has none.
func payloadBytes(t *testing.T, ns string) float64 {
	t.Helper()
	mfs, err := prometheus.DefaultGatherer.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "ledger_payload_bytes" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "namespace" && lp.GetValue() == ns {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return -1
}

// TestStart_payloadBytes: each namespace's ledger_payload_bytes is read
// at once, then every PayloadBytesEvery, and follows commits and erasures.
func TestStart_payloadBytes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg, db := newConfig(t)
		cfg.Signers, cfg.PayloadBytesEvery = nil, time.Minute
		n := db.Namespace
		r := testkit.MustReserve(t, n, testkit.ReserveReq("key-bytes-1", "exec-1"))
		testkit.MustCommit(t, n, testkit.Succeed("key-bytes-1", r.Reservation))
		s, err := nsservices.Start(t.Context(), cfg)
		require.NoError(t, err)
		defer s.Stop()
		synctest.Wait()
		first := payloadBytes(t, ledger.DefaultNamespace)
		assert.Equal(t, float64(len("re_1")+len(`{"amount":1200}`)), first, "read at start")

		const reason = "erasure request"
		_, err = n.Erase(t.Context(), ledger.EraseRequest{Keys: []string{"key-bytes-1"}, Reason: reason, Actor: "ops"})
		require.NoError(t, err)
		synctest.Wait()
		assert.Equal(t, first, payloadBytes(t, ledger.DefaultNamespace), "not before the next refresh")
		time.Sleep(cfg.PayloadBytesEvery)
		synctest.Wait()
		assert.Equal(t, float64(len(reason)), payloadBytes(t, ledger.DefaultNamespace),
			"the erased values are gone, the erase receipt's reason is kept")
	})
}
