package api

import (
	"math"
	"sync"
	"time"
)

// rateLimiter is a token bucket per principal: rate requests per second,
// bursts up to burst.
type rateLimiter struct {
	rate, burst float64
	// share, when set, is how many replicas serve the same tokens: each
	// enforces rate/share and burst/share (at least 1), so that the total
	// across replicas stays within the configured rate.
	share   func() int
	mu      sync.Mutex
	buckets map[string]*bucket
	now     func() time.Time
}

type bucket struct {
	tokens float64
	last   time.Time
}

func newRateLimiter(rate float64, burst int) *rateLimiter {
	return &rateLimiter{rate: rate, burst: float64(max(burst, 1)), buckets: map[string]*bucket{}, now: time.Now}
}

// allow takes one request from name's bucket; when it is empty it returns
// how long until the next request is allowed.
func (l *rateLimiter) allow(name string) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	rate, burst := l.rate, l.burst
	if l.share != nil {
		if n := l.share(); n > 1 {
			rate, burst = rate/float64(n), math.Max(burst/float64(n), 1)
		}
	}
	b, ok := l.buckets[name]
	if !ok {
		b = &bucket{tokens: burst, last: now}
		l.buckets[name] = b
	}
	b.tokens = math.Min(burst, b.tokens+now.Sub(b.last).Seconds()*rate)
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	return false, time.Duration((1 - b.tokens) / rate * float64(time.Second))
}
