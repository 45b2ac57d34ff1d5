package verify_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/mod/sumdb/note"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/tlog"
	"github.com/effect-ledger/effect-ledger/verify"
)

// servePruned serves the pruned file's namespace "reports" over the API.
func servePruned(t *testing.T, pf *prunedFile) verify.Server {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.OpenStore(ctx, pf.path, sqlite.Options{Logger: quiet}, false)
	require.NoError(t, err)
	l := ledger.New(st, ledger.Config{})
	t.Cleanup(func() { _ = l.Close() })
	srv := httptest.NewServer(api.NewServer(l, api.Config{Logger: quiet}))
	t.Cleanup(srv.Close)
	c, err := client.New(srv.URL, client.WithNamespace("reports"))
	require.NoError(t, err)
	return verify.Server{Client: c}
}

// lyingPrune is a server that says another hash for its last pruned
// receipt than the one its tree holds.
type lyingPrune struct {
	verify.Server
	hash chain.Hash
}

func (s lyingPrune) Pruned(ctx context.Context) (*verify.ServedPrune, error) {
	sp, err := s.Server.Pruned(ctx)
	if sp != nil {
		sp.Hash = s.hash
	}
	return sp, err
}

// TestVerifier_servedPrune: a server's pruned namespace verifies clean
// from the hash of 601, proven by its inclusion in the served checkpoint
// (signed by the key given, or not checked); a server that says another
// hash for 601 is a violation, never a pass, and so is a checkpoint
// signed by no key given; a pin at 601 counts only with the proven hash.
func TestVerifier_servedPrune(t *testing.T) {
	pf := buildPruned(t)
	ctx := context.Background()
	s := servePruned(t, pf)
	vk, err := tlog.NewVerifier(pf.vkey)
	require.NoError(t, err)
	now := func() time.Time { return pf.now }

	for _, keys := range [][]note.Verifier{nil, {vk}} {
		rep, err := verify.NewRemote(s, verify.Opts{Now: now, Keys: keys}).Check(ctx)
		require.NoError(t, err)
		require.True(t, rep.OK, "%+v", rep.Violations)
		assert.Equal(t, uint64(606), rep.Head.Seq)
		assert.Equal(t, uint64(5), rep.Checked, "602 … 606 rehashed")
		require.NotNil(t, rep.Pruned)
		assert.Equal(t, uint64(601), rep.Pruned.Through)
		assert.True(t, rep.Pruned.Proven)
		assert.Equal(t, keys != nil, rep.Pruned.Signed)
		assert.Equal(t, int64(606), rep.Pruned.TreeSize)
		assert.Empty(t, rep.Audit.Failed)
	}
	sp, err := s.Pruned(ctx)
	require.NoError(t, err)

	// Another hash for 601: kept_hash_mismatch (and 602 no longer links).
	lie := sp.Hash
	lie[0] ^= 1
	rep, err := verify.NewRemote(lyingPrune{s, lie}, verify.Opts{Now: now, Keys: []note.Verifier{vk}}).Check(ctx)
	require.NoError(t, err)
	assert.False(t, rep.OK)
	assert.Contains(t, rules(rep), verify.RuleKeptHashMismatch, "%+v", rep.Violations)
	assert.False(t, rep.Pruned.Proven)

	// The served checkpoint signed by no key given.
	_, other, err := tlog.GenerateKey("ex.test")
	require.NoError(t, err)
	ovk, err := tlog.NewVerifier(other)
	require.NoError(t, err)
	rep, err = verify.NewRemote(s, verify.Opts{Now: now, Keys: []note.Verifier{ovk}}).Check(ctx)
	require.NoError(t, err)
	assert.False(t, rep.OK)
	assert.Equal(t, []string{verify.RuleCheckpointKeyUnknown}, rules(rep), "%+v", rep.Violations)

	// Pins: exactly 601 with the proven hash is intact (incremental);
	// another hash is head_mismatch; one below P is unverified_pruned.
	at601 := &verify.Pin{Seq: 601, Hash: sp.Hash.String()}
	for _, inc := range []bool{false, true} {
		rep, err = verify.NewRemote(s, verify.Opts{Now: now, Pinned: at601, Incremental: inc}).Check(ctx)
		require.NoError(t, err)
		require.True(t, rep.OK, "%+v", rep.Violations)
		assert.Empty(t, rep.UnverifiedPruned)

		bad := &verify.Pin{Seq: 601, Hash: chain.Hash(lie).String()}
		rep, err = verify.NewRemote(s, verify.Opts{Now: now, Pinned: bad, Incremental: inc}).Check(ctx)
		require.NoError(t, err)
		assert.Equal(t, []string{verify.RuleHeadMismatch}, rules(rep), "%+v", rep.Violations)

		rep, err = verify.NewRemote(s, verify.Opts{Now: now, Pinned: &pf.pin300, Incremental: inc}).Check(ctx)
		require.NoError(t, err)
		require.True(t, rep.OK, "%+v", rep.Violations)
		assert.Equal(t, []uint64{301, 601}, rep.UnverifiedPruned)
	}
}
