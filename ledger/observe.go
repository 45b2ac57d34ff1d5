package ledger

import (
	"context"
	"time"
)

// BatchInfo describes the writer batch that made a request's write
// durable (or failed it): one transaction shared by every queued write of
// a namespace that it held.
type BatchInfo struct {
	Namespace string
	Size      int       // writes in the batch
	Start     time.Time // when the batch's transaction began
	End       time.Time // when it committed or failed
	Err       error     // nil after COMMIT
}

// BatchObserver is told about the batch of each write a request submits,
// in the writer's goroutine, after the batch ends and before the request
// gets its answer. It must be quick and must not block.
type BatchObserver func(ctx context.Context, b BatchInfo)

type observerKey struct{}

// NewContextWithBatchObserver returns ctx carrying obs, which the writer
// calls for the batch of every write submitted with the context (a
// request's trace span uses it for a child span of the batch).
func NewContextWithBatchObserver(ctx context.Context, obs BatchObserver) context.Context {
	return context.WithValue(ctx, observerKey{}, obs)
}

// batchObserverFromContext returns ctx's observer, nil when it has none.
func batchObserverFromContext(ctx context.Context) BatchObserver {
	obs, _ := ctx.Value(observerKey{}).(BatchObserver)
	return obs
}

// observeBatch tells the observers of ops about their batch.
func observeBatch(ops []*writeOp, b BatchInfo) {
	for _, op := range ops {
		if op.observe != nil {
			op.observe(op.ctx, b)
		}
	}
}
