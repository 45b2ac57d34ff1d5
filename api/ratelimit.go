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
	mu          sync.Mutex
	buckets     map[string]*bucket
	now         func() time.Time
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
	b, ok := l.buckets[name]
	if !ok {
		b = &bucket{tokens: l.burst, last: now}
		l.buckets[name] = b
	}
	b.tokens = math.Min(l.burst, b.tokens+now.Sub(b.last).Seconds()*l.rate)
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	return false, time.Duration((1 - b.tokens) / l.rate * float64(time.Second))
}

// SetRateLimit limits each token to rate requests per second with bursts
// of burst; beyond it requests get 429 rate_limited with Retry-After.
// rate <= 0 removes the limit. It applies only while auth is on (tokens
// name who is limited). Call before serving.
func (s *Server) SetRateLimit(rate float64, burst int) {
	if rate <= 0 {
		s.limiter = nil
		return
	}
	s.limiter = newRateLimiter(rate, burst)
}
