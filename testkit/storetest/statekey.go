package storetest

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// testStateKey: a namespace's secret (Chain.StateKey) is made on first
// use, 32 bytes, the same on every later call, its own per namespace,
// agreed on by concurrent first calls, and never part of the chain.
func testStateKey(t *testing.T, f Factory) {
	ctx := context.Background()
	l, _ := open(t, f)
	require.NoError(t, l.CreateNamespace(ctx, "payments", ledger.NamespaceSettings{}))
	require.NoError(t, l.CreateNamespace(ctx, "mail", ledger.NamespaceSettings{}))
	def, pay, mail := ns(t, l, ledger.DefaultNamespace), ns(t, l, "payments"), ns(t, l, "mail")

	k1, err := def.StateKey(ctx)
	require.NoError(t, err)
	require.Len(t, k1, ledger.StateKeyLen)
	k2, err := def.StateKey(ctx)
	require.NoError(t, err)
	require.Equal(t, k1, k2, "the same key on every call")

	// Concurrent first calls of a namespace agree.
	keys := make([][]byte, 16)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() {
			k, err := pay.StateKey(ctx)
			assert.NoError(t, err)
			keys[i] = k
		})
	}
	wg.Wait()
	for _, k := range keys {
		require.Equal(t, keys[0], k, "concurrent first calls agree")
	}
	require.Len(t, keys[0], ledger.StateKeyLen)
	require.NotEqual(t, k1, keys[0], "each namespace has its own key")
	k3, err := mail.StateKey(ctx)
	require.NoError(t, err)
	require.NotEqual(t, keys[0], k3)
	require.NotEqual(t, k1, k3)

	for _, n := range []*ledger.Namespace{def, pay, mail} {
		h, err := n.Head(ctx)
		require.NoError(t, err)
		require.Zero(t, h.Seq, "the key is not on the chain")
	}
	verifyClean(t, def, 0)
}

// replicasStateKey: two writers of one database making a namespace's
// secret at once agree on it.
func replicasStateKey(t *testing.T, open2 openPair) {
	a, b, _ := open2(t)
	ctx := context.Background()
	na, nb := ns(t, a, ledger.DefaultNamespace), ns(t, b, ledger.DefaultNamespace)
	keys := make([][]byte, 16)
	var wg sync.WaitGroup
	for i := range keys {
		n := na
		if i%2 == 1 {
			n = nb
		}
		wg.Go(func() {
			k, err := n.StateKey(ctx)
			assert.NoError(t, err)
			keys[i] = k
		})
	}
	wg.Wait()
	require.Len(t, keys[0], ledger.StateKeyLen)
	for _, k := range keys {
		require.Equal(t, keys[0], k, "both replicas see one key")
	}
}
