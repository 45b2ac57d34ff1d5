package goclient_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

// TestClient_Key_lifetime: in a ledger whose keys expire after an hour,
// Do replays within the hour and runs the function again as a renewed
// key at it, and Key shows the expiry and the generations.
func TestClient_Key_lifetime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := ledgertest.Open(t, ledgertest.WithStore(sqlite.Options{KeyTTL: uint64(time.Hour.Milliseconds())}))
	clock := db.Clock
	srv := httptest.NewServer(api.NewServer(db.Ledger, api.Config{Logger: quiet}))
	t.Cleanup(srv.Close)
	c := MustClient(t, srv.URL)

	var fx counter
	first, err := c.Do(ctx, refund(1), fx.fn)
	require.NoError(t, err)
	assert.Nil(t, first.Renewed)
	v, err := c.Key(ctx, first.Key, false)
	require.NoError(t, err)
	assert.Equal(t, "succeeded", v.State)
	assert.Equal(t, clock.Now().Add(time.Hour).UnixMilli(), v.ExpiresAt.UnixMilli())

	clock.Advance(time.Hour - time.Millisecond)
	again, err := c.Do(ctx, refund(1), fx.fn)
	require.NoError(t, err)
	assert.True(t, again.Replayed, "remembered one millisecond short of the TTL")
	clock.Advance(time.Millisecond)
	renewed, err := c.Do(ctx, refund(1), fx.fn)
	require.NoError(t, err)
	assert.False(t, renewed.Replayed)
	require.NotNil(t, renewed.Renewed, "at the TTL the key starts a new generation")
	assert.Equal(t, again.Receipt.Seq, renewed.Renewed.Seq)
	assert.Equal(t, int32(2), fx.runs.Load())

	v, err = c.Key(ctx, first.Key, false)
	require.NoError(t, err)
	assert.Len(t, v.Receipts, 2, "the current generation: reserve and commit")
	assert.Equal(t, again.Receipt.Seq, v.Receipts[0].RefSeq)
	assert.Equal(t, clock.Now().Add(time.Hour).UnixMilli(), v.ExpiresAt.UnixMilli())
	all, err := c.Key(ctx, first.Key, true)
	require.NoError(t, err)
	assert.Len(t, all.Receipts, 5)
	_, err = c.Key(ctx, "no-such-key-1", false)
	assert.ErrorIs(t, err, client.ErrUnknownKey)
}
