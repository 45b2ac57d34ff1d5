package goclient_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// charge is a non-idempotent effect: an interrupted attempt is
// unsafe_resume, which Effect.Reconcile may settle (SPEC §15).
func charge(order int, lookup client.ReconcileFunc) client.Effect {
	return client.Effect{Tool: "payments.charge", Class: client.ClassExternal,
		Input: map[string]any{"order": order, "amount": 1200}, Reconcile: lookup}
}

// interrupted sets the reconcile policy (settle ms) and leaves e's key
// interrupted by a crashed attempt.
func interrupted(t *testing.T, c *client.Client, l *Ledger, advance func(time.Duration), e client.Effect, settle int) {
	t.Helper()
	_, err := c.SetPolicy(context.Background(), map[string]any{"rules": []any{
		map[string]any{"tool": "payments.*", "reconcile": map[string]any{"allow": true, "settle_ms": settle}}}})
	require.NoError(t, err)
	hold(t, c, e, 20*time.Millisecond)
	advance(50 * time.Millisecond)
	require.Equal(t, ledger.StateInterrupted, keyState(t, l.DB, mustKey(t, l, e)))
}

func TestClient_Do_reconcile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	found := func(context.Context, string) (client.Reconciled, error) {
		return client.Reconciled{Outcome: client.OutcomeSucceeded, ExternalRef: "ch_1", Result: json.RawMessage(`{"amount":1200}`),
			Lookup: "payments.find_charge", Answer: json.RawMessage(`{"applied":true}`)}, nil
	}
	nothing := func(_ context.Context, key string) (client.Reconciled, error) {
		return client.Reconciled{Outcome: client.OutcomeNotApplied, Failure: &client.Failure{Code: "NOT_FOUND"},
			Lookup: "payments.find_charge", Answer: json.RawMessage(`{"applied":false,"key":"` + key + `"}`)}, nil
	}
	t.Run("OK succeeded is replayed without running", func(t *testing.T) {
		l, clock := MustOpenLedgerClock(t)
		c := MustClient(t, l.HTTP.URL)
		var asked []string
		e := charge(1, func(ctx context.Context, key string) (client.Reconciled, error) {
			asked = append(asked, key)
			return found(ctx, key)
		})
		interrupted(t, c, l, clock.Advance, e, 60000)
		var fx counter
		res, err := c.Do(ctx, e, fx.fn)
		require.NoError(t, err)
		assert.True(t, res.Replayed)
		assert.True(t, res.Reconciled)
		assert.Equal(t, "ch_1", res.ExternalRef)
		assert.JSONEq(t, `{"amount":1200}`, string(res.Result))
		assert.Zero(t, fx.runs.Load(), "the function did not run")
		assert.Equal(t, []string{mustKey(t, l, e)}, asked, "the lookup is asked by the key, once")
		assert.Equal(t, ledger.StateSucceeded, keyState(t, l.DB, mustKey(t, l, e)))
		again, err := c.Do(ctx, charge(1, nil), fx.fn)
		require.NoError(t, err)
		assert.True(t, again.Replayed)
		assert.False(t, again.Reconciled)
		assert.Equal(t, "ch_1", again.ExternalRef)
	})
	t.Run("OK not_applied waits out settle_ms and runs once", func(t *testing.T) {
		l, clock := MustOpenLedgerClock(t)
		var mu sync.Mutex
		var waited time.Duration
		c := MustClient(t, l.HTTP.URL, client.WithSleep(func(ctx context.Context, d time.Duration) error {
			mu.Lock()
			defer mu.Unlock()
			waited += d
			clock.Advance(d)
			return ctx.Err()
		}))
		e := charge(2, nothing)
		interrupted(t, c, l, clock.Advance, e, 5000)
		var fx counter
		dctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		res, err := c.Do(dctx, e, fx.fn)
		require.NoError(t, err)
		assert.False(t, res.Replayed)
		assert.NotNil(t, res.AfterNotApplied)
		assert.Equal(t, int32(1), fx.runs.Load())
		mu.Lock()
		assert.GreaterOrEqual(t, waited, 4*time.Second, "reconcile_too_early waited out")
		mu.Unlock()
		assert.Equal(t, ledger.StateSucceeded, keyState(t, l.DB, mustKey(t, l, e)))
	})
	t.Run("OK the original call lands during the settle time: asked again, not run", func(t *testing.T) {
		l, clock := MustOpenLedgerClock(t)
		c := MustClient(t, l.HTTP.URL, client.WithSleep(func(ctx context.Context, d time.Duration) error {
			clock.Advance(d)
			return ctx.Err()
		}))
		var asks atomic.Int32
		// Nothing at first; the charge has landed by the time the settle time is over.
		e := charge(6, func(ctx context.Context, key string) (client.Reconciled, error) {
			if asks.Add(1) == 1 {
				return nothing(ctx, key)
			}
			return found(ctx, key)
		})
		interrupted(t, c, l, clock.Advance, e, 5000)
		var fx counter
		dctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		res, err := c.Do(dctx, e, fx.fn)
		require.NoError(t, err)
		assert.True(t, res.Replayed && res.Reconciled, "the answer after the settle time is recorded")
		assert.Zero(t, fx.runs.Load(), "never charged twice")
		assert.Equal(t, int32(2), asks.Load(), "asked again after waiting")
		assert.Equal(t, ledger.StateSucceeded, keyState(t, l.DB, mustKey(t, l, e)))
	})
	t.Run("ErrUnsafeResume when the lookup has no answer", func(t *testing.T) {
		l, clock := MustOpenLedgerClock(t)
		c := MustClient(t, l.HTTP.URL)
		e := charge(3, func(context.Context, string) (client.Reconciled, error) {
			return client.Reconciled{}, errors.New("lookup timed out")
		})
		interrupted(t, c, l, clock.Advance, e, 0)
		var fx counter
		_, err := c.Do(ctx, e, fx.fn)
		assert.ErrorIs(t, err, client.ErrUnsafeResume)
		assert.Zero(t, fx.runs.Load())
		assert.Equal(t, ledger.StateInterrupted, keyState(t, l.DB, mustKey(t, l, e)), "nothing recorded")
	})
	t.Run("ErrReconcileTooEarly past the caller's deadline", func(t *testing.T) {
		l, clock := MustOpenLedgerClock(t)
		c := MustClient(t, l.HTTP.URL)
		e := charge(4, nothing)
		interrupted(t, c, l, clock.Advance, e, 600000)
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		var fx counter
		_, err := c.Do(dctx, e, fx.fn)
		assert.ErrorIs(t, err, client.ErrUnsafeResume)
		assert.ErrorIs(t, err, client.ErrReconcileTooEarly)
		assert.NoError(t, dctx.Err(), "answered at once, not after the deadline")
		assert.Zero(t, fx.runs.Load())
	})
	t.Run("ErrReconcileNotAllowed without a rule", func(t *testing.T) {
		l, clock := MustOpenLedgerClock(t)
		c := MustClient(t, l.HTTP.URL)
		e := charge(5, found)
		hold(t, c, e, 20*time.Millisecond)
		clock.Advance(50 * time.Millisecond)
		_, err := c.Do(ctx, e, (&counter{}).fn)
		assert.ErrorIs(t, err, client.ErrUnsafeResume)
		assert.ErrorIs(t, err, client.ErrReconcileNotAllowed)
	})
}

func TestClient_Reconcile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, clock := MustOpenLedgerClock(t)
	c := MustClient(t, l.HTTP.URL)
	e := charge(1, nil)
	interrupted(t, c, l, clock.Advance, e, 0)
	_, err := c.Reconcile(ctx, mustKey(t, l, e), client.Reconciled{Outcome: "failed", Failure: &client.Failure{Code: "X"},
		Lookup: "q", Answer: json.RawMessage(`{}`)})
	assert.ErrorIs(t, err, client.ErrInvalidRequest)
	rec, err := c.Reconcile(ctx, mustKey(t, l, e), client.Reconciled{Outcome: client.OutcomeNotApplied,
		Failure: &client.Failure{Code: "NOT_FOUND"}, Lookup: "payments.find_charge", Answer: json.RawMessage(`{"applied":false}`)})
	require.NoError(t, err)
	assert.Equal(t, "not_applied", rec.State)
	assert.Equal(t, mustKey(t, l, e), rec.Key)
	_, err = c.Reconcile(ctx, mustKey(t, l, e), client.Reconciled{Outcome: client.OutcomeNotApplied,
		Failure: &client.Failure{Code: "NOT_FOUND"}, Lookup: "payments.find_charge", Answer: json.RawMessage(`{}`)})
	assert.ErrorIs(t, err, client.ErrNotInterrupted)
	_, err = c.Reconcile(ctx, "no-such-key-1", client.Reconciled{Outcome: client.OutcomeSucceeded, ExternalRef: "x",
		Lookup: "q", Answer: json.RawMessage(`{}`)})
	assert.ErrorIs(t, err, client.ErrUnknownKey)
	_, err = c.Reconcile(ctx, "no-such-key-1", client.Reconciled{Outcome: client.OutcomeSucceeded, ExternalRef: "x"})
	assert.ErrorContains(t, err, "evidence", "refused before it is sent")
}
