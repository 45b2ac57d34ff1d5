package tick_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/effect-ledger/effect-ledger/internal/tick"
)

// Every calls f once per interval, not at once, and returns when its
// context ends.
func TestEvery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		var mu sync.Mutex
		var calls []time.Duration
		seen := func() []time.Duration { mu.Lock(); defer mu.Unlock(); return calls }
		start := time.Now()
		done := make(chan struct{})
		go func() {
			defer close(done)
			tick.Every(ctx, time.Second, func(context.Context) {
				mu.Lock()
				defer mu.Unlock()
				calls = append(calls, time.Since(start))
			})
		}()
		synctest.Wait()
		assert.Empty(t, seen(), "no call before the first interval")
		time.Sleep(3*time.Second + time.Millisecond)
		synctest.Wait()
		assert.Equal(t, []time.Duration{time.Second, 2 * time.Second, 3 * time.Second}, seen())
		cancel()
		<-done
	})
}
