package goclient_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

// refund is the effect most tests run.
func refund(order int) client.Effect {
	return client.Effect{Tool: "payments.refund", Class: client.ClassWrite, Idempotent: true,
		Input: map[string]any{"order": order, "amount": 1200}}
}

// counter is an effect function that counts its runs and succeeds.
type counter struct{ runs atomic.Int32 }

func (c *counter) fn(ctx context.Context, key string) (client.Outcome, error) {
	n := c.runs.Add(1)
	return client.Outcome{ExternalRef: fmt.Sprintf("re_%d", n), Result: map[string]any{"refunded": 1200, "key": key}}, nil
}

// doRuns runs e through c with a counter, fails t unless Do succeeds,
// and returns Do's result and the counter's runs.
func doRuns(t *testing.T, c *client.Client, e client.Effect) (*client.Result, int32) {
	t.Helper()
	var fx counter
	res, err := c.Do(context.Background(), e, fx.fn)
	require.NoError(t, err)
	return res, fx.runs.Load()
}

// keyState reads a key's state from the ledger.
func keyState(t *testing.T, l *ledgertest.DB, key string) ledger.State {
	t.Helper()
	v, err := l.GetKey(context.Background(), key)
	require.NoError(t, err)
	return v.State
}

func TestClient_Do(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("OK replay does not rerun the function", func(t *testing.T) {
		l := MustOpenLedger(t)
		c := MustClient(t, l.HTTP.URL)
		var fx counter
		first, err := c.Do(ctx, refund(1), fx.fn)
		require.NoError(t, err)
		assert.False(t, first.Replayed)
		assert.Equal(t, "re_1", first.ExternalRef)
		assert.Equal(t, uint64(1), first.Attempt)
		assert.Equal(t, uint64(2), first.Receipt.Seq)

		again, err := c.Do(ctx, refund(1), fx.fn) // the model calls the tool again
		require.NoError(t, err)
		assert.True(t, again.Replayed)
		assert.Equal(t, int32(1), fx.runs.Load(), "the function ran once")
		assert.Equal(t, first.Key, again.Key)
		assert.Equal(t, "re_1", again.ExternalRef)
		assert.JSONEq(t, string(first.Result), string(again.Result))
		assert.Equal(t, first.Receipt, again.Original)
		assert.Equal(t, uint64(3), again.Receipt.Seq)

		other, err := c.Do(ctx, refund(2), fx.fn) // another input, another key
		require.NoError(t, err)
		assert.False(t, other.Replayed)
		assert.NotEqual(t, first.Key, other.Key)
		assert.Equal(t, int32(2), fx.runs.Load())
	})
	t.Run("OK the function gets the key", func(t *testing.T) {
		l := MustOpenLedger(t)
		c := MustClient(t, l.HTTP.URL)
		e := refund(1)
		e.Key = "refund-order-0001"
		var got string
		res, err := c.Do(ctx, e, func(ctx context.Context, key string) (client.Outcome, error) {
			got = key
			return client.Outcome{}, nil
		})
		require.NoError(t, err)
		assert.Equal(t, "refund-order-0001", got)
		assert.Equal(t, "refund-order-0001", res.Key)
		assert.Nil(t, res.Result)
		v, err := l.DB.GetKey(ctx, e.Key)
		require.NoError(t, err)
		fp, err := client.Fingerprint(e.Input)
		require.NoError(t, err)
		stored, err := l.DB.StoredInputHash(ctx, fp)
		require.NoError(t, err)
		assert.Equal(t, stored, v.InputHash, "the client's fingerprint is the ledger's (keyed in a committed namespace)")
	})
	t.Run("OK retryable failure of an idempotent effect runs again", func(t *testing.T) {
		l := MustOpenLedger(t)
		c := MustClient(t, l.HTTP.URL)
		boom := errors.New("psp timed out before charging")
		_, err := c.Do(ctx, refund(1), func(context.Context, string) (client.Outcome, error) {
			return client.Outcome{}, client.Retryable("PSP_TIMEOUT", boom)
		})
		var ee *client.EffectError
		require.ErrorAs(t, err, &ee)
		assert.ErrorIs(t, err, boom, "the function's error is kept")
		assert.Equal(t, "PSP_TIMEOUT", ee.Failure.Code)
		assert.True(t, ee.Failure.Retryable)
		assert.Equal(t, ledger.StateFailed, keyState(t, l.DB, ee.Key))

		res, runs := doRuns(t, c, refund(1))
		assert.True(t, res.Retry)
		assert.Equal(t, int32(1), runs)
	})
	t.Run("OK NotApplied commits not_applied and the key runs again", func(t *testing.T) {
		l := MustOpenLedger(t)
		c := MustClient(t, l.HTTP.URL)
		e := refund(1)
		e.Idempotent = false // not_applied needs neither idempotent nor retryable
		refused := errors.New("psp refused: card expired")
		_, err := c.Do(ctx, e, func(context.Context, string) (client.Outcome, error) {
			return client.Outcome{}, client.NotApplied("CARD_EXPIRED", refused)
		})
		var ee *client.EffectError
		require.ErrorAs(t, err, &ee)
		assert.ErrorIs(t, err, refused)
		assert.True(t, ee.Failure.NotApplied)
		assert.False(t, ee.Failure.Retryable)
		assert.Contains(t, err.Error(), "applied nothing")
		assert.Equal(t, ledger.StateNotApplied, keyState(t, l.DB, ee.Key))
		v, err := c.Key(ctx, ee.Key, false)
		require.NoError(t, err)
		assert.Equal(t, "not_applied", v.State)

		res, runs := doRuns(t, c, e)
		assert.Equal(t, int32(1), runs, "the function ran again")
		require.NotNil(t, res.AfterNotApplied)
		assert.Equal(t, client.NotAppliedRef{Seq: ee.Receipt.Seq, ErrorCode: "CARD_EXPIRED"}, *res.AfterNotApplied)
		assert.False(t, res.Retry || res.Takeover)
		assert.Equal(t, ledger.StateSucceeded, keyState(t, l.DB, ee.Key))
	})
	t.Run("OK Commit records not_applied", func(t *testing.T) {
		l := MustOpenLedger(t)
		c := MustClient(t, l.HTTP.URL)
		rsv, err := c.Reserve(ctx, client.ReserveRequest{Key: "mail-key-0001", ExecutionID: "exec-1", Tool: "email.send",
			Class: client.ClassExternal})
		require.NoError(t, err)
		cr, err := c.Commit(ctx, rsv.Key, rsv.Token, client.Commit{Outcome: "not_applied",
			Failure: &client.Failure{Code: "INVALID_ADDRESS", Retryable: true}})
		require.NoError(t, err)
		assert.Equal(t, "not_applied", cr.Outcome)
		again, err := c.Reserve(ctx, client.ReserveRequest{Key: "mail-key-0001", ExecutionID: "exec-2", Tool: "email.send",
			Class: client.ClassExternal})
		require.NoError(t, err)
		assert.Equal(t, "reserved", again.Status)
		require.NotNil(t, again.AfterNotApplied)
		assert.Equal(t, cr.Receipt.Seq, again.AfterNotApplied.Seq)
	})
	t.Run("OK Do again for the same execution is its next attempt", func(t *testing.T) {
		l := MustOpenLedger(t)
		c := MustClient(t, l.HTTP.URL)
		e := refund(1)
		e.ExecutionID = "tool-call-7"
		_, err := c.Do(ctx, e, func(context.Context, string) (client.Outcome, error) {
			return client.Outcome{}, client.Retryable("PSP_TIMEOUT", errors.New("timeout"))
		})
		require.Error(t, err)
		res, err := c.Do(ctx, e, (&counter{}).fn)
		require.NoError(t, err)
		assert.True(t, res.Retry)
		assert.Equal(t, uint64(2), res.Attempt)

		e.Key, e.Attempt = "explicit-attempt-1", 1 // a caller that counts attempts itself
		_, err = c.Do(ctx, e, func(context.Context, string) (client.Outcome, error) {
			return client.Outcome{}, client.Retryable("PSP_TIMEOUT", errors.New("timeout"))
		})
		require.Error(t, err)
		_, err = c.Do(ctx, e, (&counter{}).fn)
		assert.ErrorIs(t, err, client.ErrAttemptConflict)
	})
	t.Run("ErrRetryNotAllowed after a permanent failure", func(t *testing.T) {
		l := MustOpenLedger(t)
		c := MustClient(t, l.HTTP.URL)
		_, err := c.Do(ctx, refund(1), func(context.Context, string) (client.Outcome, error) {
			return client.Outcome{}, client.Permanent("CARD_DECLINED", errors.New("declined"))
		})
		require.Error(t, err)
		var fx counter
		_, err = c.Do(ctx, refund(1), fx.fn)
		assert.ErrorIs(t, err, client.ErrRetryNotAllowed)
		var le *client.Error
		require.ErrorAs(t, err, &le)
		assert.Equal(t, 409, le.Status)
		assert.Equal(t, "CARD_DECLINED", le.Details["failure"].(map[string]any)["error_code"])
		assert.Zero(t, fx.runs.Load())
	})
	t.Run("ErrRetryNotAllowed a plain error is a permanent failure", func(t *testing.T) {
		l := MustOpenLedger(t)
		c := MustClient(t, l.HTTP.URL)
		_, err := c.Do(ctx, refund(1), func(context.Context, string) (client.Outcome, error) {
			return client.Outcome{}, errors.New("bad request to the PSP")
		})
		var ee *client.EffectError
		require.ErrorAs(t, err, &ee)
		assert.Equal(t, client.DefaultFailureCode, ee.Failure.Code)
		assert.False(t, ee.Failure.Retryable)
		assert.Equal(t, "bad request to the PSP", ee.Failure.Message)
		_, err = c.Do(ctx, refund(1), (&counter{}).fn)
		assert.ErrorIs(t, err, client.ErrRetryNotAllowed)
	})
	t.Run("ErrFingerprintMismatch the key reused for another input", func(t *testing.T) {
		l := MustOpenLedger(t)
		c := MustClient(t, l.HTTP.URL)
		e := refund(1)
		e.Key = "refund-order-0001"
		_, err := c.Do(ctx, e, (&counter{}).fn)
		require.NoError(t, err)
		e.Input = map[string]any{"order": 1, "amount": 9999}
		var fx counter
		_, err = c.Do(ctx, e, fx.fn)
		assert.ErrorIs(t, err, client.ErrFingerprintMismatch)
		var le *client.Error
		require.ErrorAs(t, err, &le)
		assert.Equal(t, 422, le.Status)
		assert.Equal(t, "payments.refund", le.Details["tool"])
		assert.Zero(t, fx.runs.Load())
	})
	t.Run("ErrUnsafeResume an interrupted effect that is not idempotent", func(t *testing.T) {
		l, clock := MustOpenLedgerClock(t)
		c := MustClient(t, l.HTTP.URL)
		e := refund(1)
		e.Idempotent = false
		hold(t, c, e, 20*time.Millisecond)
		clock.Advance(50 * time.Millisecond) // the crashed gateway's lease ends
		var fx counter
		_, err := c.Do(ctx, e, fx.fn)
		assert.ErrorIs(t, err, client.ErrUnsafeResume)
		assert.Zero(t, fx.runs.Load())
	})
	t.Run("OK an interrupted idempotent effect is taken over", func(t *testing.T) {
		l, clock := MustOpenLedgerClock(t)
		c := MustClient(t, l.HTTP.URL)
		e := refund(1)
		hold(t, c, e, 20*time.Millisecond)
		clock.Advance(50 * time.Millisecond)
		res, runs := doRuns(t, c, e)
		assert.True(t, res.Takeover)
		assert.Equal(t, int32(1), runs)
	})
	t.Run("OK none and read effects skip the ledger", func(t *testing.T) {
		l := MustOpenLedger(t)
		c := MustClient(t, l.HTTP.URL)
		res, runs := doRuns(t, c, client.Effect{Tool: "orders.get", Class: client.ClassRead, Input: 1})
		assert.True(t, res.NotRecorded)
		assert.Equal(t, int32(1), runs)
		assert.Zero(t, l.DB.Head().Seq)
	})
	t.Run("ErrInvalid effects are refused before any call", func(t *testing.T) {
		c := MustClient(t, "127.0.0.1:1")
		_, err := c.Do(ctx, client.Effect{Tool: "x", Class: "delete"}, (&counter{}).fn)
		assert.ErrorContains(t, err, "unknown class")
		_, err = c.Do(ctx, client.Effect{Class: client.ClassWrite}, (&counter{}).fn)
		assert.ErrorContains(t, err, "empty tool")
		_, err = c.Do(ctx, client.Effect{Tool: "cache.flush", Class: client.ClassWrite}, (&counter{}).fn)
		assert.ErrorContains(t, err, "no Input to derive one from")
		_, err = c.Do(ctx, client.Effect{Tool: "x", Class: client.ClassWrite, Input: json.RawMessage(`{"a":`)}, (&counter{}).fn)
		assert.Error(t, err)
	})
	t.Run("ErrMalformedResult a replayed result that is not JSON", func(t *testing.T) {
		l := MustOpenLedger(t)
		front := MustFront(t, l.HTTP.URL)
		front.Set(func(w http.ResponseWriter, r *http.Request, _ func()) bool {
			if !strings.HasSuffix(r.URL.Path, "/reserve") {
				return false
			}
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Idempotent-Replayed", "true")
			_, _ = io.WriteString(w, `{"status":"replayed","idempotency_key":"k-edited-1","key_generated":false,"outcome":"succeeded",`+
				`"external_ref":"re_1","result":"{not json","result_encoding":"text","original":{"seq":2,"hash":"00"},"receipt":{"seq":3,"hash":"00"}}`)
			return true
		})
		var fx counter
		_, err := MustClient(t, front.HTTP.URL).Do(ctx, refund(1), fx.fn)
		assert.ErrorIs(t, err, client.ErrMalformedResult)
		assert.Zero(t, fx.runs.Load())
	})
	t.Run("OK a result too large to record: the success is recorded without it", func(t *testing.T) {
		l := MustOpenLedger(t)
		c := MustClient(t, l.HTTP.URL)
		res, err := c.Do(ctx, refund(1), func(context.Context, string) (client.Outcome, error) {
			return client.Outcome{ExternalRef: "re_big", Result: strings.Repeat("x", 70<<10)}, nil
		})
		require.NoError(t, err)
		assert.True(t, res.ResultDropped)
		assert.Nil(t, res.Result)
		assert.Equal(t, ledger.StateSucceeded, keyState(t, l.DB, res.Key))
		again, err := c.Do(ctx, refund(1), (&counter{}).fn)
		require.NoError(t, err)
		assert.Equal(t, "re_big", again.ExternalRef)
	})
}

// TestClient_Do_inProgress: while another gateway holds the key, Do waits
// for it and then returns its result without running the function.
func TestClient_Do_inProgress(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		desc  string
		polls bool // the client polls (WithWait(0)) instead of waiting in the server
	}{
		{"OK server-side wait", false},
		{"OK polling with Retry-After", true},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			l := MustOpenLedger(t)
			// The client's pauses between polls end when the test says.
			p := newPauser()
			opts := []client.Option{client.WithSleep(p.sleep)}
			if tt.polls {
				opts = append(opts, client.WithWait(0), client.WithPollInterval(100*time.Millisecond))
			}
			c := MustClient(t, l.HTTP.URL, opts...)
			e := refund(1)
			held := hold(t, c, e, 0)

			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var fx counter
			type reply struct {
				res *client.Result
				err error
			}
			done := make(chan reply, 1)
			go func() {
				res, err := c.Do(ctx, e, fx.fn)
				done <- reply{res, err}
			}()
			if tt.polls {
				select {
				case <-p.paused: // told in_progress, Do pauses before it polls again
				case r := <-done:
					t.Fatalf("Do returned while the key was held: %+v %v", r.res, r.err)
				}
			} else {
				require.Eventually(t, func() bool { return l.DB.Ledger.Waiting() == 1 }, 60*time.Second, time.Millisecond,
					"Do's reserve waits in the server")
			}
			select {
			case r := <-done:
				t.Fatalf("Do returned while the key was held: %+v %v", r.res, r.err)
			default:
			}
			close(p.resume)
			_, err := c.Commit(context.Background(), held.Key, held.Token, client.Commit{Outcome: "succeeded",
				ExternalRef: "re_other", Result: json.RawMessage(`{"by":"other"}`)})
			require.NoError(t, err)
			r := <-done
			require.NoError(t, r.err)
			assert.True(t, r.res.Replayed)
			assert.Equal(t, "re_other", r.res.ExternalRef)
			assert.JSONEq(t, `{"by":"other"}`, string(r.res.Result))
			assert.Zero(t, fx.runs.Load())
		})
	}
	t.Run("ErrInProgress when the deadline comes first", func(t *testing.T) {
		l := MustOpenLedger(t)
		c := MustClient(t, l.HTTP.URL)
		e := refund(1)
		hold(t, c, e, 0)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		start := time.Now()
		_, err := c.Do(ctx, e, (&counter{}).fn)
		assert.ErrorIs(t, err, client.ErrInProgress)
		var le *client.Error
		require.ErrorAs(t, err, &le)
		assert.Positive(t, le.RetryAfter)
		assert.Less(t, time.Since(start), 20*time.Second)
		assert.GreaterOrEqual(t, time.Since(start), time.Second, "it waited")
	})
	t.Run("OK a ledger that refuses wait_ms is polled", func(t *testing.T) {
		l := MustOpenLedger(t)
		front := MustFront(t, l.HTTP.URL)
		var refused atomic.Int32
		front.Set(func(w http.ResponseWriter, r *http.Request, _ func()) bool {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(strings.NewReader(string(body)))
			r.ContentLength = int64(len(body))
			if strings.Contains(string(body), `"wait_ms"`) {
				refused.Add(1)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(400)
				_, _ = io.WriteString(w, `{"error":{"code":"invalid_request","message":"unknown field \"wait_ms\"","details":{"field":"wait_ms"}}}`)
				return true
			}
			return false
		})
		p := newPauser()
		c := MustClient(t, front.HTTP.URL, client.WithPollInterval(50*time.Millisecond), client.WithSleep(p.sleep))
		e := refund(1)
		held := hold(t, c, e, 0)
		go func() {
			<-p.paused // Do was told in_progress and pauses before polling again
			_, _ = c.Commit(context.Background(), held.Key, held.Token, client.Commit{Outcome: "succeeded"})
			close(p.resume)
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		res, err := c.Do(ctx, e, (&counter{}).fn)
		require.NoError(t, err)
		assert.True(t, res.Replayed)
		assert.Equal(t, int32(1), refused.Load(), "wait_ms is not sent again")
	})
}

// TestClient_Do_retries: 503 and 429 are retried honouring Retry-After.
func TestClient_Do_retries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("OK 503 before the ledger", func(t *testing.T) {
		l := MustOpenLedger(t)
		front := MustFront(t, l.HTTP.URL)
		var injected atomic.Int32
		front.Set(func(w http.ResponseWriter, r *http.Request, _ func()) bool {
			if injected.Add(1) > 2 { // the first reserve and its first retry
				return false
			}
			return busy(w, "1")
		})
		var mu sync.Mutex
		var waits []time.Duration // what the client waited, recorded instead of spent
		c := MustClient(t, front.HTTP.URL, client.WithSleep(func(ctx context.Context, d time.Duration) error {
			mu.Lock()
			defer mu.Unlock()
			waits = append(waits, d)
			return ctx.Err()
		}))
		var fx counter
		res, err := c.Do(ctx, refund(1), fx.fn)
		require.NoError(t, err)
		mu.Lock()
		require.Len(t, waits, 2, "two Retry-After: 1")
		for _, d := range waits {
			assert.GreaterOrEqual(t, d, time.Second, "Retry-After is honoured (plus jitter)")
			assert.Less(t, d, 2*time.Second)
		}
		mu.Unlock()
		assert.Equal(t, int32(1), fx.runs.Load())
		assert.Equal(t, uint64(1), res.Attempt, "nothing was recorded: same attempt")
	})
	t.Run("OK 503 from a proxy page without the contract's body", func(t *testing.T) {
		l := MustOpenLedger(t)
		front := MustFront(t, l.HTTP.URL)
		var injected atomic.Int32
		front.Set(func(w http.ResponseWriter, r *http.Request, _ func()) bool {
			if injected.Add(1) > 1 {
				return false
			}
			w.WriteHeader(503)
			_, _ = io.WriteString(w, "<html>upstream overloaded</html>")
			return true
		})
		c := MustClient(t, front.HTTP.URL, client.WithRetry(3, 10*time.Millisecond, 50*time.Millisecond))
		_, err := c.Do(ctx, refund(1), (&counter{}).fn)
		require.NoError(t, err)
	})
	t.Run("ErrUnavailable when the retries run out", func(t *testing.T) {
		l := MustOpenLedger(t)
		front := MustFront(t, l.HTTP.URL)
		front.Set(func(w http.ResponseWriter, r *http.Request, _ func()) bool {
			return busy(w, "")
		})
		c := MustClient(t, front.HTTP.URL, client.WithRetry(2, 10*time.Millisecond, 20*time.Millisecond))
		var fx counter
		_, err := c.Do(ctx, refund(1), fx.fn)
		assert.ErrorIs(t, err, client.ErrUnavailable)
		assert.Equal(t, int64(3), front.Seen.Load(), "one call and two retries")
		assert.Zero(t, fx.runs.Load())
	})
	t.Run("ErrUnavailable a Retry-After beyond the deadline is not waited for", func(t *testing.T) {
		l := MustOpenLedger(t)
		front := MustFront(t, l.HTTP.URL)
		front.Set(func(w http.ResponseWriter, r *http.Request, _ func()) bool {
			return busy(w, "30")
		})
		c := MustClient(t, front.HTTP.URL)
		ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		_, err := c.Do(ctx, refund(1), (&counter{}).fn)
		assert.ErrorIs(t, err, client.ErrUnavailable)
		assert.NoError(t, ctx.Err(), "answered before the deadline, not after waiting for it")
	})
	t.Run("OK 429 from the ledger's rate limit, with a bearer token", func(t *testing.T) {
		l, clock := MustOpenLedgerClock(t, func(c *api.Config) { c.RateLimit, c.RateBurst = 1, 1 })
		tok := l.MustToken(t, "gateway", ledger.RoleWriter)
		var mu sync.Mutex
		var waited time.Duration // the client's waits, spent on the ledger's clock
		c := MustClient(t, l.HTTP.URL, client.WithToken(tok), client.WithSleep(func(ctx context.Context, d time.Duration) error {
			mu.Lock()
			defer mu.Unlock()
			waited += d
			clock.Advance(d)
			return ctx.Err()
		}))
		var fx counter
		for i := range 3 { // reserve and commit each: 6 requests at 1/s
			_, err := c.Do(ctx, refund(i), fx.fn)
			require.NoError(t, err)
		}
		mu.Lock()
		assert.GreaterOrEqual(t, waited, 4*time.Second, "paced by Retry-After")
		mu.Unlock()
		assert.Equal(t, int32(3), fx.runs.Load())
		v, err := l.DB.GetKey(ctx, mustKey(t, l, refund(0)))
		require.NoError(t, err)
		assert.Equal(t, "gateway", v.Receipts[0].Actor)

		bad := MustClient(t, l.HTTP.URL, client.WithToken("elt_wrong"))
		_, err = bad.Do(ctx, refund(9), fx.fn)
		assert.ErrorIs(t, err, client.ErrUnauthorized)
	})
	t.Run("OK 503 from --max-inflight", func(t *testing.T) {
		l := MustOpenLedger(t, func(c *api.Config) { c.MaxInFlight = 1 })
		// Another process holds the database's write lock: a reserve in
		// flight waits for it (up to the busy timeout) and holds the only
		// place until the client has been refused once.
		other, err := sql.Open("sqlite3", "file:"+l.Path+"?_txlock=immediate")
		require.NoError(t, err)
		t.Cleanup(func() { _ = other.Close() })
		lock, err := other.Begin()
		require.NoError(t, err)
		var once sync.Once
		unlock := func() { once.Do(func() { _ = lock.Rollback() }) }
		t.Cleanup(unlock) // before the server's cleanup
		// The reserve is sent again while --max-inflight refuses it (a poll
		// below held the place when it came): once it is in, only it can
		// make a poll see 503.
		go func() {
			for {
				req, err := http.NewRequestWithContext(t.Context(), "POST", l.HTTP.URL+"/v1/effects/reserve",
					strings.NewReader(`{"idempotency_key":"held-key-0001","execution_id":"e","tool":"t","effect":"write"}`))
				if err != nil {
					return
				}
				req.Header.Set("Content-Type", "application/json")
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					return
				}
				res.Body.Close()
				if res.StatusCode != 503 {
					return
				}
			}
		}()
		require.Eventually(t, func() bool {
			res, err := http.Get(l.HTTP.URL + "/v1/head")
			if err != nil {
				return false
			}
			res.Body.Close()
			return res.StatusCode == 503
		}, 60*time.Second, 10*time.Millisecond)
		var refused atomic.Int32
		hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			res, err := http.DefaultTransport.RoundTrip(r)
			if err == nil && res.StatusCode == 503 && res.Header.Get("Retry-After") != "" {
				refused.Add(1)
				unlock()
			}
			return res, err
		})}
		var fx counter
		_, err = MustClient(t, l.HTTP.URL, client.WithHTTPClient(hc)).Do(ctx, refund(1), fx.fn)
		require.NoError(t, err)
		assert.Equal(t, int32(1), fx.runs.Load())
		assert.Positive(t, refused.Load(), "refused first, then served after Retry-After")
	})
}

// hold reserves e's key as another gateway would (execution
// exec-other), with lease (0: the default).
func hold(t *testing.T, cl *client.Client, e client.Effect, lease time.Duration) *client.Reservation {
	t.Helper()
	fp, err := client.Fingerprint(e.Input)
	require.NoError(t, err)
	dk, err := cl.DerivationKey(context.Background())
	require.NoError(t, err)
	key, err := dk.DeriveKey(e.Tool, e.Input)
	require.NoError(t, err)
	r, err := cl.Reserve(context.Background(), client.ReserveRequest{Key: key, ExecutionID: "exec-other",
		Tool: e.Tool, Class: e.Class, Idempotent: e.Idempotent, InputHash: fp, Lease: lease})
	require.NoError(t, err)
	require.Equal(t, "reserved", r.Status)
	return r
}

func c(t *testing.T, l *Ledger) *client.Client { return MustClient(t, l.HTTP.URL) }

// mustKey is the key the client derives for e in l's default namespace
// (SPEC §14: dk2_ in a committed one, dk_ in an inline one).
func mustKey(t *testing.T, l *Ledger, e client.Effect) string {
	t.Helper()
	ctx := context.Background()
	dk := &client.DerivationKey{Payloads: string(l.DB.Payloads())}
	if l.DB.Payloads() == ledger.PayloadsCommitted {
		k, err := l.DB.FingerprintKey(ctx)
		require.NoError(t, err)
		dk.Key = k
	}
	k, err := dk.DeriveKey(e.Tool, e.Input)
	require.NoError(t, err)
	return k
}

// pauser is a client's sleep between polls that ends when the test says:
// each pause signals paused (if nothing is pending there) and lasts until
// resume is closed or the request's context ends.
type pauser struct {
	paused chan struct{}
	resume chan struct{}
}

// newPauser returns a pauser whose pauses last until resume is closed.
func newPauser() *pauser {
	return &pauser{paused: make(chan struct{}, 1), resume: make(chan struct{})}
}

// sleep is the client.WithSleep function.
func (p *pauser) sleep(ctx context.Context, _ time.Duration) error {
	select {
	case p.paused <- struct{}{}:
	default:
	}
	select {
	case <-p.resume:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// busy answers 503 with the contract's unavailable body and, unless
// retryAfter is empty, a Retry-After; it returns true, as a front's
// handler does when it answered.
func busy(w http.ResponseWriter, retryAfter string) bool {
	if retryAfter != "" {
		w.Header().Set("Retry-After", retryAfter)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(503)
	_, _ = io.WriteString(w, `{"error":{"code":"unavailable","message":"busy","details":{}}}`)
	return true
}

// loseFirstAnswer makes front pass the first request whose path ends in
// suffix to the ledger and hang up on its client: the ledger records it,
// the answer is lost.
func loseFirstAnswer(front *Front, suffix string) {
	var dropped atomic.Int32
	front.Set(func(w http.ResponseWriter, r *http.Request, forward func()) bool {
		if strings.HasSuffix(r.URL.Path, suffix) && dropped.Add(1) == 1 {
			forward()
			hangUp(w)
			return true
		}
		return false
	})
}

// TestClient_Do_lostAnswers: answers lost on the network never make an
// effect run twice or vanish.
func TestClient_Do_lostAnswers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("OK a lost commit answer is retried and recognized", func(t *testing.T) {
		l := MustOpenLedger(t)
		front := MustFront(t, l.HTTP.URL)
		loseFirstAnswer(front, "/commit")
		cl := MustClient(t, front.HTTP.URL, client.WithRetry(3, 10*time.Millisecond, 50*time.Millisecond))
		var fx counter
		res, err := cl.Do(ctx, refund(1), fx.fn)
		require.NoError(t, err)
		assert.Equal(t, int32(1), fx.runs.Load())
		assert.Equal(t, ledger.StateSucceeded, keyState(t, l.DB, res.Key))
		assert.Equal(t, uint64(2), l.DB.Head().Seq, "one commit receipt")
	})
	t.Run("OK a lost reserve answer: the next attempt takes the lease over", func(t *testing.T) {
		l := MustOpenLedger(t)
		front := MustFront(t, l.HTTP.URL)
		loseFirstAnswer(front, "/reserve")
		cl := MustClient(t, front.HTTP.URL, client.WithRetry(3, 10*time.Millisecond, 50*time.Millisecond))
		e := refund(1)
		e.Lease = 300 * time.Millisecond
		var fx counter
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		res, err := cl.Do(ctx, e, fx.fn)
		require.NoError(t, err)
		assert.True(t, res.Takeover, "the lost reservation ended and was taken over")
		assert.Equal(t, uint64(2), res.Attempt)
		assert.Equal(t, int32(1), fx.runs.Load())
	})
	t.Run("ErrCommit the ledger is gone after the effect ran", func(t *testing.T) {
		l := MustOpenLedger(t)
		front := MustFront(t, l.HTTP.URL)
		front.Set(func(w http.ResponseWriter, r *http.Request, _ func()) bool {
			if strings.HasSuffix(r.URL.Path, "/commit") {
				hangUp(w)
				return true
			}
			return false
		})
		cl := MustClient(t, front.HTTP.URL, client.WithRetry(2, 10*time.Millisecond, 20*time.Millisecond),
			client.WithCommitTimeout(500*time.Millisecond))
		var fx counter
		_, err := cl.Do(ctx, refund(1), fx.fn)
		var ce *client.CommitError
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, "succeeded", ce.Commit.Outcome)
		assert.Equal(t, "re_1", ce.Commit.ExternalRef)
		assert.NotEmpty(t, ce.Reservation)
		assert.Greater(t, front.Seen.Load(), int64(3), "the commit was retried")
		assert.Equal(t, ledger.StateReserved, keyState(t, l.DB, ce.Key), "not lost: still reserved")

		// Later, with the ledger back, the caller records it.
		cr, err := c(t, l).Commit(ctx, ce.Key, ce.Reservation, ce.Commit)
		require.NoError(t, err)
		assert.Equal(t, "succeeded", cr.Outcome)
		res, err := c(t, l).Do(ctx, refund(1), fx.fn)
		require.NoError(t, err)
		assert.True(t, res.Replayed)
		assert.Equal(t, int32(1), fx.runs.Load())
	})
	t.Run("OK the caller's context ends after the effect ran: it is still recorded", func(t *testing.T) {
		l := MustOpenLedger(t)
		ctx, cancel := context.WithCancel(ctx)
		res, err := c(t, l).Do(ctx, refund(1), func(context.Context, string) (client.Outcome, error) {
			cancel() // the gateway's request is gone, but the refund happened
			return client.Outcome{ExternalRef: "re_1"}, nil
		})
		require.NoError(t, err)
		assert.Equal(t, ledger.StateSucceeded, keyState(t, l.DB, res.Key))
	})
}

// TestClient_Do_unknownOutcome: when the effect may or may not have
// happened, nothing is recorded and the reservation is handed back.
func TestClient_Do_unknownOutcome(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tt := range []struct {
		desc string
		err  error
	}{
		{"ErrOutcomeUnknown", fmt.Errorf("psp: %w", client.ErrOutcomeUnknown)},
		{"ErrDeadlineExceeded", fmt.Errorf("psp: %w", context.DeadlineExceeded)},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			l := MustOpenLedger(t)
			_, err := c(t, l).Do(ctx, refund(1), func(context.Context, string) (client.Outcome, error) {
				return client.Outcome{}, tt.err
			})
			var ue *client.UnknownOutcomeError
			require.ErrorAs(t, err, &ue)
			assert.ErrorIs(t, err, tt.err)
			assert.NotEmpty(t, ue.Reservation)
			assert.Equal(t, ledger.StateReserved, keyState(t, l.DB, ue.Key))
			_, err = c(t, l).Commit(ctx, ue.Key, ue.Reservation, client.Commit{Outcome: "failed",
				Failure: &client.Failure{Code: "NOT_CHARGED", Message: "checked the PSP", Retryable: true}})
			require.NoError(t, err)
			assert.Equal(t, ledger.StateFailed, keyState(t, l.DB, ue.Key))
		})
	}
}

// TestClient_Do_panic: a panicking effect is not recorded as an outcome;
// Do panics again with the key and reservation.
func TestClient_Do_panic(t *testing.T) {
	t.Parallel()
	l := MustOpenLedger(t)
	ctx := context.Background()
	var pe *client.PanicError
	func() {
		defer func() {
			v := recover()
			require.NotNil(t, v)
			var ok bool
			pe, ok = v.(*client.PanicError)
			require.True(t, ok, "panic value %T", v)
		}()
		_, _ = c(t, l).Do(ctx, refund(1), func(context.Context, string) (client.Outcome, error) {
			panic("nil map in the refund handler")
		})
	}()
	assert.Equal(t, "nil map in the refund handler", pe.Value)
	assert.Contains(t, string(pe.Stack), "client_test")
	assert.Equal(t, ledger.StateReserved, keyState(t, l.DB, pe.Key))
	_, err := c(t, l).Commit(ctx, pe.Key, pe.Reservation, client.Commit{Outcome: "succeeded", ExternalRef: "re_checked"})
	require.NoError(t, err)
	res, err := c(t, l).Do(ctx, refund(1), (&counter{}).fn)
	require.NoError(t, err)
	assert.Equal(t, "re_checked", res.ExternalRef)
}

func TestNew(t *testing.T) {
	t.Parallel()
	l := MustOpenLedger(t)
	hostPort := strings.TrimPrefix(l.HTTP.URL, "http://")
	for _, tt := range []struct {
		desc, url, want, wantErr string
	}{
		{desc: "OK without scheme", url: hostPort, want: "http://" + hostPort},
		{desc: "OK trailing slash", url: l.HTTP.URL + "/", want: l.HTTP.URL},
		{desc: "OK path prefix", url: "https://ledger.example.com/ledger/", want: "https://ledger.example.com/ledger"},
		{desc: "ErrEmpty", url: " ", wantErr: "empty"},
		{desc: "ErrScheme", url: "ftp://x", wantErr: "scheme"},
		{desc: "ErrQuery", url: "http://x/?a=1", wantErr: "query"},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			cl, err := client.New(tt.url)
			if tt.wantErr != "" {
				assert.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, cl.BaseURL())
		})
	}
	t.Run("OK custom http.Client and no scheme against the real ledger", func(t *testing.T) {
		var used atomic.Int32
		hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			used.Add(1)
			return http.DefaultTransport.RoundTrip(r)
		})}
		cl := MustClient(t, hostPort, client.WithHTTPClient(hc))
		_, err := cl.Do(context.Background(), refund(1), (&counter{}).fn)
		require.NoError(t, err)
		assert.Equal(t, int32(3), used.Load(), "the derivation key, the reserve, the commit")
	})
	t.Run("ErrOptions", func(t *testing.T) {
		_, err := client.New("x:1", client.WithWait(61*time.Second))
		assert.Error(t, err)
		_, err = client.New("x:1", client.WithRetry(1, 0, 0))
		assert.Error(t, err)
		_, err = client.New("x:1", client.WithHTTPClient(nil))
		assert.Error(t, err)
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestClient_noCgo: a gateway importing the client does not pull in the
// ledger's SQLite driver or the server.
func TestClient_noCgo(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, dep := range []string{"github.com/mattn/go-sqlite3", "github.com/effect-ledger/effect-ledger/ledger",
		"github.com/effect-ledger/effect-ledger/api"} {
		assert.NotContains(t, strings.Fields(string(out)), dep)
	}
}
