package api

import "context"

type contextKey int

const actorKey contextKey = iota

// NewContextWithActor returns ctx carrying the authenticated principal
// recorded as actor on the receipts a request causes.
func NewContextWithActor(ctx context.Context, actor string) context.Context {
	return context.WithValue(ctx, actorKey, actor)
}

// ActorFromContext returns the authenticated principal, or "" without auth.
func ActorFromContext(ctx context.Context) string {
	a, _ := ctx.Value(actorKey).(string)
	return a
}
