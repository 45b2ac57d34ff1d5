package goclient_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// TestClient_Do_derivedKey2 (SPEC §14): in a committed namespace Do
// derives dk2_ keys with the namespace's derivation key, asked of the
// ledger once per Client; a fetch that fails fails the call as an
// unreachable ledger does (nothing runs, nothing is reserved) and is not
// kept; an inline namespace keeps dk_.
func TestClient_Do_derivedKey2(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := MustOpenLedger(t)
	require.NoError(t, l.DB.Ledger.CreateNamespace(ctx, "people", ledger.NamespaceSettings{Payloads: ledger.PayloadsCommitted}))
	people, err := l.DB.Ledger.NS(ctx, "people")
	require.NoError(t, err)
	fpKey, err := people.FingerprintKey(ctx)
	require.NoError(t, err)

	front := MustFront(t, l.HTTP.URL)
	var asked, down atomic.Int32
	down.Store(1)
	front.Set(func(w http.ResponseWriter, r *http.Request, _ func()) bool {
		if !strings.HasSuffix(r.URL.Path, "/derivation-key") {
			return false
		}
		asked.Add(1)
		return down.Load() == 1 && busy(w, "")
	})
	c := MustClient(t, front.HTTP.URL, client.WithNamespace("people"), client.WithRetry(1, time.Millisecond, time.Millisecond))
	var fx counter
	_, err = c.Do(ctx, refund(7), fx.fn)
	require.ErrorIs(t, err, client.ErrUnavailable)
	assert.Zero(t, fx.runs.Load(), "nothing ran")
	h, err := people.Head(ctx)
	require.NoError(t, err)
	assert.Zero(t, h.Seq, "nothing reserved")

	down.Store(0)
	first, err := c.Do(ctx, refund(7), fx.fn)
	require.NoError(t, err)
	want, err := client.DeriveKeyWith(fpKey, refund(7).Tool, refund(7).Input)
	require.NoError(t, err)
	assert.Equal(t, want, first.Key)
	again, err := c.Do(ctx, refund(7), fx.fn)
	require.NoError(t, err)
	assert.True(t, again.Replayed)
	_, err = c.Do(ctx, refund(8), fx.fn)
	require.NoError(t, err)
	assert.Equal(t, int32(3), asked.Load(), "two failed tries, then once for every later call")
	v, err := people.GetKey(ctx, want)
	require.NoError(t, err)
	assert.Equal(t, ledger.StateSucceeded, v.State)

	require.NoError(t, l.DB.Ledger.CreateNamespace(ctx, "older", ledger.NamespaceSettings{Payloads: ledger.PayloadsInline}))
	inline, err := MustClient(t, l.HTTP.URL, client.WithNamespace("older")).Do(ctx, refund(7), fx.fn)
	require.NoError(t, err)
	plain, err := client.DeriveKey(refund(7).Tool, refund(7).Input)
	require.NoError(t, err)
	assert.Equal(t, plain, inline.Key, "an inline namespace: dk_")
	def, err := MustClient(t, l.HTTP.URL).Do(ctx, refund(7), fx.fn)
	require.NoError(t, err)
	assert.Equal(t, mustKey(t, l, refund(7)), def.Key, "the default namespace of a new ledger is committed: dk2_")
	assert.True(t, strings.HasPrefix(def.Key, "dk2_"), def.Key)
}
