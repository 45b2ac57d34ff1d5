package ledger

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// groupRecorder is a GroupUpdater that records the keys of each group's
// parts and runs nothing.
type groupRecorder struct {
	mu     sync.Mutex
	groups [][][]string
}

func (r *groupRecorder) UpdateGroup(_ context.Context, parts []GroupPart) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := make([][]string, len(parts))
	for i, p := range parts {
		g[i] = p.Keys
	}
	r.groups = append(r.groups, g)
	return nil
}

// fakeQueue is a namespace's queue as a joiner: ops that more takes in.
type fakeQueue struct {
	mu     sync.Mutex
	g      *groupCommit
	keys   []string // the batch's
	queued []string // not taken in yet
}

func (q *fakeQueue) more() []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.g.queued.Add(-int64(len(q.queued)))
	q.keys = append(q.keys, q.queued...)
	q.queued = nil
	return q.keys
}

func (q *fakeQueue) backlog() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.queued)
}

// TestGroup_WaitsForQueuedNamespaces: under load, a group does not start
// while a namespace that has queued ops has not handed its batch in yet,
// even if the ops already handed in and queued reach the previous
// group's size: those ops would not join it, and the group would be
// spent on the first namespaces back (issue 31). Here the old rule
// (enough ops counted anywhere) ran "a" alone at once.
func TestGroup_WaitsForQueuedNamespaces(t *testing.T) {
	rec := &groupRecorder{}
	g := newGroupCommit(rec, 10*time.Second)
	g.lastOps = 3
	fn := func(context.Context, Tx) error { return nil }

	// b has two ops queued; its writer has not handed its batch in.
	g.queued.Add(2)
	var wg sync.WaitGroup
	a := &fakeQueue{g: g, keys: []string{"a1"}}
	wg.Go(func() { assert.NoError(t, g.update(context.Background(), nil, a.keys, fn, a)) })
	time.Sleep(100 * time.Millisecond)
	rec.mu.Lock()
	require.Empty(t, rec.groups, "the group started without the namespace whose ops are queued")
	rec.mu.Unlock()

	// b's writer takes its first op and hands its batch in; the second
	// is still in its queue and joins through more.
	g.queued.Add(-1)
	b := &fakeQueue{g: g, keys: []string{"b1"}, queued: []string{"b2"}}
	wg.Go(func() { assert.NoError(t, g.update(context.Background(), nil, b.keys, fn, b)) })
	wg.Wait()
	assert.Equal(t, [][][]string{{{"a1"}, {"b1", "b2"}}}, rec.groups)
}

// TestGroup_LingerBoundsTheWait: a namespace that never hands its batch
// in holds the group back for the linger at most.
func TestGroup_LingerBoundsTheWait(t *testing.T) {
	rec := &groupRecorder{}
	g := newGroupCommit(rec, 50*time.Millisecond)
	g.lastOps = 3
	g.queued.Add(5)
	a := &fakeQueue{g: g, keys: []string{"a1"}}
	start := time.Now()
	require.NoError(t, g.update(context.Background(), nil, a.keys, func(context.Context, Tx) error { return nil }, a))
	assert.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond)
	assert.Equal(t, [][][]string{{{"a1"}}}, rec.groups)
}
