// Package tick runs a function at a fixed interval until its context
// ends: the background loops of the binaries (a rescan of namespaces, a
// count of replicas) are this one loop.
package tick

import (
	"context"
	"time"
)

// Every calls f(ctx) every d, the first call d from now, and returns when
// ctx ends; a call under way is not interrupted except through ctx.
func Every(ctx context.Context, d time.Duration, f func(context.Context)) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f(ctx)
		}
	}
}
