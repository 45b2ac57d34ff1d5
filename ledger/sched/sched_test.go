package sched_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger/sched"
)

// recorder is a flush that records each group as "ns[items]" per batch,
// and blocks between hold and release.
type recorder struct {
	mu     sync.Mutex
	groups [][]string
	gate   chan struct{} // non-nil: flushes wait for it to close
	fail   map[string]error
}

func (r *recorder) hold() {
	r.mu.Lock()
	r.gate = make(chan struct{})
	r.mu.Unlock()
}

func (r *recorder) release() {
	r.mu.Lock()
	close(r.gate)
	r.gate = nil
	r.mu.Unlock()
}

func (r *recorder) flush(group []sched.Batch[int]) []error {
	r.mu.Lock()
	gate := r.gate
	r.mu.Unlock()
	if gate != nil {
		<-gate
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var g []string
	errs := make([]error, len(group))
	for i, b := range group {
		g = append(g, fmt.Sprint(b.NS, b.Items))
		errs[i] = r.fail[b.NS]
	}
	r.groups = append(r.groups, g)
	return errs
}

func (r *recorder) seen() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]string(nil), r.groups...)
}

func add(t *testing.T, q *sched.Queue[int], ns string, item int) *sched.Future {
	t.Helper()
	f, err := q.Add(context.Background(), ns, item)
	require.NoError(t, err)
	return f
}

// An idle queue flushes a lone operation at once; what is added while a
// flush runs goes, across namespaces and in the order added, into the
// next group (namespaces in the order of their first operation), whose
// futures complete with their batch's answer.
func TestQueue_groupsAcrossNamespaces(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &recorder{fail: map[string]error{"b": assert.AnError}}
		q := sched.New(r.flush, sched.Options{Linger: time.Second})
		defer q.Close()
		require.NoError(t, add(t, q, "a", 1).Wait(context.Background()))
		assert.Equal(t, [][]string{{"a[1]"}}, r.seen(), "a lone operation, at once")

		r.hold() // the next flush blocks
		f2 := add(t, q, "a", 2)
		synctest.Wait()
		fs := []*sched.Future{add(t, q, "b", 3), add(t, q, "a", 4), add(t, q, "c", 5), add(t, q, "a", 6)}
		r.release()
		require.NoError(t, f2.Wait(context.Background()))
		assert.ErrorIs(t, fs[0].Wait(context.Background()), assert.AnError, "b's answer")
		for _, f := range fs[1:] {
			require.NoError(t, f.Wait(context.Background()))
		}
		assert.Equal(t, [][]string{{"a[1]"}, {"a[2]"}, {"b[3]", "a[4 6]", "c[5]"}}, r.seen())
	})
}

// Under load (the previous group held more than one operation) a group
// waits up to Linger for as many operations as the previous one held.
func TestQueue_lingerUnderLoad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &recorder{}
		q := sched.New(r.flush, sched.Options{Linger: 50 * time.Millisecond})
		defer q.Close()
		r.hold()
		f0 := add(t, q, "a", 0)
		synctest.Wait()
		f1, f2 := add(t, q, "a", 1), add(t, q, "b", 2)
		r.release()
		require.NoError(t, f1.Wait(context.Background()))
		require.NoError(t, f2.Wait(context.Background()))
		require.NoError(t, f0.Wait(context.Background()))

		start := time.Now()
		f3 := add(t, q, "a", 3)
		synctest.Wait()
		assert.Len(t, r.seen(), 2, "one operation of the two the last group held: the group waits")
		f4 := add(t, q, "c", 4)
		require.NoError(t, f3.Wait(context.Background()))
		require.NoError(t, f4.Wait(context.Background()))
		assert.Less(t, time.Since(start), 50*time.Millisecond, "two arrived: no need to wait out the linger")
		assert.Equal(t, []string{"a[3]", "c[4]"}, r.seen()[2])

		start = time.Now()
		require.NoError(t, add(t, q, "a", 5).Wait(context.Background()))
		assert.Equal(t, 50*time.Millisecond, time.Since(start), "the linger bounds the wait")
	})
}

// Add waits for room while MaxPending operations of its namespace wait,
// and gives up when its context ends; Close flushes what is queued and
// refuses later Adds.
func TestQueue_boundedAndClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &recorder{}
		q := sched.New(r.flush, sched.Options{MaxOps: 2})
		r.hold()
		add(t, q, "a", 0)
		synctest.Wait() // 0 is being flushed
		f1, f2 := add(t, q, "a", 1), add(t, q, "a", 2)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := q.Add(ctx, "a", 3)
		assert.ErrorIs(t, err, context.DeadlineExceeded, "a full namespace makes Add wait")
		f4, err := q.Add(context.Background(), "b", 4)
		require.NoError(t, err, "another namespace has room")
		r.release()
		q.Close()
		for _, f := range []*sched.Future{f1, f2, f4} {
			require.NoError(t, f.Wait(context.Background()), "Close flushes what is queued")
		}
		_, err = q.Add(context.Background(), "a", 5)
		assert.ErrorIs(t, err, sched.ErrClosed)
	})
}
