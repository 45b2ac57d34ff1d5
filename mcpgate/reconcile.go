package mcpgate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/mcpgate/downstream"
	"github.com/effect-ledger/effect-ledger/mcpgate/ledgerport"
	"github.com/effect-ledger/effect-ledger/mcpgate/policy"
	"github.com/effect-ledger/effect-ledger/mcpgate/reconcile"
	"github.com/effect-ledger/effect-ledger/mcpgate/template"
	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
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

// reconcileUnknown acts on a reserve's refusal refused when it is
// unsafe_resume for a tool whose rule names a lookup: it asks the lookup
// once and records what it found. again: the reserve is to be made again
// (the ledger recorded a reconcile, or the key is no longer interrupted);
// reply: the model's answer instead (a not_applied the ledger finds too
// early). Neither: the refusal stands, nothing was recorded.
func (g *Gateway) reconcileUnknown(ctx context.Context, s *mcp.ClientSession, c *call, key string, refused error) (reply mcp.Result, again bool) {
	var refusal *ledgerport.Refusal
	if !errors.As(refused, &refusal) || refusal.Code != ledger.ECodeUnsafeResume {
		return nil, false
	}
	l, ok := g.cfg.Policy.Lookup(c.name, c.ledgerTool)
	if !ok {
		return nil, false
	}
	for asked := 0; ; asked++ {
		r, ok := g.askLookup(ctx, s, c, key, l)
		if !ok {
			return nil, false
		}
		err := g.port.Reconcile(ctx, key, r)
		if errors.As(err, &refusal) && refusal.Code == ledger.ECodeNotInterrupted {
			return nil, true // decided meanwhile (a person, another gateway): the reserve says how
		}
		notBefore, early := tooEarly(err)
		wait := time.Until(notBefore)
		switch {
		case err == nil:
			g.logger.InfoContext(ctx, "interrupted call reconciled by its lookup", "tool", c.ledgerTool, "key", key,
				"outcome", r.Outcome, "lookup", r.Lookup)
			return nil, true
		case early && asked == 0 && !notBefore.IsZero() && wait <= g.cfg.Wait:
			// The original call may still land until the settle time:
			// ask again once it has passed, so that what is recorded was
			// seen after it.
			if !sleep(ctx, wait) {
				return nil, false
			}
			continue
		case early:
			return tooEarlyAnswer(key, notBefore), false
		}
		g.logger.WarnContext(ctx, "lookup found, but the ledger did not record it: the key waits for a person",
			"tool", c.ledgerTool, "key", key, "err", err)
		return nil, false
	}
}

// askLookup calls the lookup l about a call's key once, within
// UpstreamTimeout, and reads its answer as evidence; ok false: no
// evidence (the tool no longer read-only, an argument missing, an error,
// no answer, or an answer that says neither), logged.
func (g *Gateway) askLookup(ctx context.Context, s *mcp.ClientSession, c *call, key string, l *policy.Lookup) (client.Reconciled, bool) {
	noEvidence := func(msg string, err error) {
		lookupsTotal.WithLabelValues(c.toolLabel, LookupNone).Inc()
		g.logger.WarnContext(ctx, msg+": the key waits for a person", "tool", c.ledgerTool, "key", key, "lookup", l.Tool, "err", err)
	}
	t, err := g.tools.Lookup(ctx, s, l.Tool)
	if err == nil {
		err = reconcile.CheckTool(l.Tool, t)
	}
	if err != nil {
		noEvidence("lookup not asked", err)
		return client.Reconciled{}, false
	}
	var args map[string]json.RawMessage
	_ = json.Unmarshal(c.args, &args)
	input, err := template.Render(l.Arguments, template.Vars{Key: key, Arguments: args})
	if err != nil {
		noEvidence("lookup not asked", err)
		return client.Reconciled{}, false
	}
	lctx, cancel := context.WithTimeout(ctx, g.cfg.UpstreamTimeout)
	defer cancel()
	lctx, slot := wire.WithSlot(lctx)
	res, err := s.CallTool(lctx, &mcp.CallToolParams{Name: l.Tool, Arguments: input, Meta: mcp.Meta{MetaKey: key}})
	raw := slot.Get()
	if err == nil && raw == nil {
		raw, err = json.Marshal(res)
	}
	if err != nil {
		noEvidence("lookup failed", err)
		return client.Reconciled{}, false
	}
	f, err := reconcile.Judge(raw, l.ByKey())
	if err != nil {
		noEvidence("lookup answered no evidence", err)
		return client.Reconciled{}, false
	}
	r := client.Reconciled{Outcome: client.OutcomeNotApplied, Lookup: LedgerToolName(g.cfg.ServerName, l.Tool), Answer: f.Answer,
		Failure: &client.Failure{Code: reconcile.CodeNotFound, Message: fmt.Sprintf("the lookup %q found no effect under the key", l.Tool)}}
	if f.Applied {
		lookupsTotal.WithLabelValues(c.toolLabel, LookupApplied).Inc()
		r.Outcome, r.ExternalRef, r.Failure = client.OutcomeSucceeded, f.ExternalRef, nil
		r.Result = ledgerport.ResultNote(fmt.Sprintf("Reconciled, not run again: an earlier identical call was interrupted, "+
			"and the tool server's read-only lookup %q found that it applied, external reference %q.", l.Tool, f.ExternalRef))
	} else {
		lookupsTotal.WithLabelValues(c.toolLabel, LookupNotApplied).Inc()
	}
	return r, true
}

// tooEarly reports whether err is the ledger's reconcile_too_early, and
// when the settle time it names has passed (zero: not named).
func tooEarly(err error) (time.Time, bool) {
	var refusal *ledgerport.Refusal
	if !errors.As(err, &refusal) || refusal.Code != ledger.ECodeReconcileTooEarly {
		return time.Time{}, false
	}
	return refusal.NotBefore(), true
}

// tooEarlyAnswer tells the model that the lookup found nothing yet, but
// the interrupted call may still land until notBefore.
func tooEarlyAnswer(key string, notBefore time.Time) *mcp.CallToolResult {
	until := "for a while"
	if !notBefore.IsZero() {
		until = "until " + notBefore.UTC().Truncate(time.Second).Add(time.Second).Format(time.RFC3339)
	}
	return answer(ledger.ECodeReconcileTooEarly, key, fmt.Sprintf("An earlier identical call was interrupted and its "+
		"outcome is unknown. The tool server's lookup finds no sign of it yet, but the interrupted call may still take "+
		"effect %s, so this call was NOT run. Call it again after that time: it runs then if the lookup still "+
		"finds nothing (idempotency key %s).", until, key))
}

// sleep waits d, or until ctx ends (false).
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
