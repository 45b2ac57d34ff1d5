package goclient_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
)

func TestClient_WithNamespace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := MustOpenLedger(t)
	require.NoError(t, l.DB.Ledger.CreateNamespace(ctx, "payments", ledger.NamespaceSettings{}))

	t.Run("OK a key per namespace", func(t *testing.T) {
		pay := MustClient(t, l.HTTP.URL, client.WithNamespace("payments"))
		assert.Equal(t, "payments", pay.Namespace())
		def := MustClient(t, l.HTTP.URL, client.WithNamespace("default"))
		assert.Equal(t, "default", def.Namespace())
		var fx counter
		first, err := pay.Do(ctx, refund(1), fx.fn)
		require.NoError(t, err)
		assert.Equal(t, uint64(2), first.Receipt.Seq, "payments' own chain: reserve 1, commit 2")
		again, err := pay.Do(ctx, refund(1), fx.fn)
		require.NoError(t, err)
		assert.True(t, again.Replayed)

		other, err := def.Do(ctx, refund(1), fx.fn)
		require.NoError(t, err)
		assert.False(t, other.Replayed, "the same call in default is another effect")
		assert.NotEqual(t, first.Key, other.Key, "each committed namespace derives keys with its own key (SPEC §14)")
		assert.Equal(t, uint64(2), other.Receipt.Seq)
		assert.Equal(t, int32(2), fx.runs.Load())

		n, err := l.DB.Ledger.NS(ctx, "payments")
		require.NoError(t, err)
		h, err := n.Head(ctx)
		require.NoError(t, err)
		assert.Equal(t, uint64(3), h.Seq, "reserve, commit, replay in payments")
		v, err := n.GetKey(ctx, first.Key)
		require.NoError(t, err)
		assert.Equal(t, ledger.StateSucceeded, v.State)
	})

	t.Run("ErrUnknownNamespace", func(t *testing.T) {
		c := MustClient(t, l.HTTP.URL, client.WithNamespace("nope"))
		var fx counter
		_, err := c.Do(ctx, refund(1), fx.fn)
		require.ErrorIs(t, err, client.ErrUnknownNamespace)
		var ce *client.Error
		require.True(t, errors.As(err, &ce))
		assert.Equal(t, 404, ce.Status)
		assert.Zero(t, fx.runs.Load(), "nothing ran")
	})

	t.Run("ErrForbidden outside the token's namespaces", func(t *testing.T) {
		l := MustOpenLedger(t)
		require.NoError(t, l.DB.Ledger.CreateNamespace(ctx, "payments", ledger.NamespaceSettings{}))
		toks, err := sqlite.OpenTokens(ctx, l.Path)
		require.NoError(t, err)
		tok, err := toks.Create(ctx, "pay-gw", ledger.RoleWriter, "payments")
		require.NoError(t, err)
		require.NoError(t, toks.Close())
		l.Server.RequireAuth()
		var fx counter
		_, err = MustClient(t, l.HTTP.URL, client.WithToken(tok)).Do(ctx, refund(1), fx.fn)
		assert.ErrorIs(t, err, client.ErrForbidden, "the token may not use default")
		_, err = MustClient(t, l.HTTP.URL, client.WithToken(tok), client.WithNamespace("payments")).Do(ctx, refund(1), fx.fn)
		assert.NoError(t, err)
		assert.Equal(t, int32(1), fx.runs.Load())
	})

	t.Run("ErrName", func(t *testing.T) {
		for _, ns := range []string{"Payments", "a/b", "a b", string(make([]byte, 65))} {
			_, err := client.New(l.HTTP.URL, client.WithNamespace(ns))
			assert.ErrorContains(t, err, "namespace", "%q", ns)
		}
	})
}
