package api

import (
	"context"

	"github.com/effect-ledger/effect-ledger/ledger"
)

type contextKey int

const (
	actorKey contextKey = iota
	principalKey
)

// NewContextWithPrincipal returns ctx carrying the authenticated
// principal and its name as actor.
func NewContextWithPrincipal(ctx context.Context, p ledger.Principal) context.Context {
	return context.WithValue(NewContextWithActor(ctx, p.Name), principalKey, p)
}

// PrincipalFromContext returns the authenticated principal; ok is false
// without auth.
func PrincipalFromContext(ctx context.Context) (p ledger.Principal, ok bool) {
	p, ok = ctx.Value(principalKey).(ledger.Principal)
	return p, ok
}

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
