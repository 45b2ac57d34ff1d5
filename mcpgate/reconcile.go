package mcpgate

import (
	"context"
	"fmt"

	"github.com/effect-ledger/effect-ledger/mcpgate/downstream"
	"github.com/effect-ledger/effect-ledger/mcpgate/reconcile"
)

// The reconcile extension (SPEC §15, package reconcile) joins the path
// where a reserve answers unsafe_resume: for a tool whose --policy rule
// names a lookup, the gateway asks the upstream's read-only lookup once
// and records what it found as the ledger's reconcile, then reserves again.

// CheckLookups refuses a policy whose lookups name a tool the upstream up
// does not list, or does not annotate readOnlyHint: true, or that the
// policy itself classes as an effect: a lookup must not act. ledger-mcp
// calls it at start, before the policy reaches the ledger.
func CheckLookups(ctx context.Context, up *Upstream, p Policy, serverName string) error {
	tools := p.LookupTools()
	if len(tools) == 0 {
		return nil
	}
	s, err := up.Session(ctx)
	if err != nil {
		return fmt.Errorf("check the lookups: %w", err)
	}
	listed := downstream.NewTools()
	for _, name := range tools {
		t, err := listed.Lookup(ctx, s, name)
		if err != nil {
			return fmt.Errorf("check the lookups: list the upstream's tools: %w", err)
		}
		if err := reconcile.CheckTool(name, t); err != nil {
			return err
		}
		if c := Classify(p, name, LedgerToolName(ToolNamePart(serverName), name), t.Annotations); c.Recorded() {
			return fmt.Errorf("the lookup tool %q is classed %q by the policy: a lookup must be a read", name, c.Effect)
		}
	}
	return nil
}
