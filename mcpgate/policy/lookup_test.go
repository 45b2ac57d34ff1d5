package policy_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/mcpgate/policy"
)

func TestParse_lookup(t *testing.T) {
	for _, tc := range []struct {
		desc, in, wantErr string
	}{
		{"OK", `[{"tool": "pay", "lookup": {"tool": "find", "arguments": {"k": "{{key}}"}}}]`, ""},
		{"OKWithEffectAndReconcile", `[{"tool": "pay", "effect": "external", "lookup": {"tool": "find"}, "reconcile": {"allow": true, "settle_ms": 0}}]`, ""},
		{"NoTool", `[{"tool": "pay", "lookup": {"arguments": {}}}]`, `lookup: empty "tool"`},
		{"ArgumentsNotObject", `[{"tool": "pay", "lookup": {"tool": "find", "arguments": ["{{key}}"]}}]`, "must be a JSON object"},
		{"BadPlaceholder", `[{"tool": "pay", "lookup": {"tool": "find", "arguments": {"k": "{{idempotency_key}}"}}}]`, "is not {{key}}"},
		{"ReadWithLookup", `[{"tool": "pay", "effect": "read", "lookup": {"tool": "find"}}]`, "never interrupted"},
		{"ReconcileDenied", `[{"tool": "pay", "lookup": {"tool": "find"}, "reconcile": {"allow": false}}]`, "cannot deny its reconcile"},
		{"UnknownMember", `[{"tool": "pay", "lookup": {"tool": "find", "args": {}}}]`, "unknown field"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			_, err := policy.Parse([]byte(tc.in))
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
		})
	}
}

func TestPolicy_Lookup(t *testing.T) {
	p, err := policy.Parse([]byte(`[
		{"tool": "pay", "effect": "external"},
		{"tool": "pay*", "lookup": {"tool": "find_payment", "arguments": {"key": "{{key}}"}}},
		{"tool": "*", "lookup": {"tool": "search", "arguments": {"q": "{{arguments.order}}"}}}]`))
	require.NoError(t, err)
	l, ok := p.Lookup("pay", "shop.pay")
	require.True(t, ok)
	assert.Equal(t, "find_payment", l.Tool, "the first rule that sets one")
	assert.True(t, l.ByKey())
	l, ok = p.Lookup("refund", "shop.refund")
	require.True(t, ok)
	assert.False(t, l.ByKey(), "a search by order is no evidence of absence")
	assert.Equal(t, []string{"find_payment", "search"}, p.LookupTools())
	assert.False(t, p.HasGate(), "a lookup is no member of the gate: --ledger takes it")
}

// TestPolicy_LedgerPolicyOver: a rule's lookup becomes the ledger's
// reconcile rule for its tool; a file with lookups only keeps the policy
// in force (a person's), its own earlier reconcile rules replaced; a file
// with gate members replaces it.
func TestPolicy_LedgerPolicyOver(t *testing.T) {
	lookups, err := policy.Parse([]byte(`[{"tool": "pay", "lookup": {"tool": "find"}, "reconcile": {"allow": true, "settle_ms": 500}}]`))
	require.NoError(t, err)
	inForce, err := ledger.ParsePolicy([]byte(`{"rules": [
		{"tool": "pay", "reconcile": {"allow": true, "settle_ms": 9}},
		{"tool": "shop.refund", "approval": "required"}], "self_approval": "allow"}`))
	require.NoError(t, err)
	raw, err := lookups.LedgerPolicyOver("shop", inForce)
	require.NoError(t, err)
	assert.JSONEq(t, `{"rules": [
		{"tool": "pay", "reconcile": {"allow": true, "settle_ms": 500}},
		{"tool": "shop.pay", "reconcile": {"allow": true, "settle_ms": 500}},
		{"tool": "shop.refund", "approval": "required"}], "self_approval": "allow"}`, string(raw))
	again, err := ledger.ParsePolicy(raw)
	require.NoError(t, err)
	raw2, err := lookups.LedgerPolicyOver("shop", again)
	require.NoError(t, err)
	assert.JSONEq(t, string(raw), string(raw2), "a restart writes the same policy")
	g := again.GateFor("shop.pay", "external")
	assert.True(t, g.Reconcile)
	assert.Equal(t, uint64(500), g.SettleMS)

	gated, err := policy.Parse([]byte(`[{"tool": "pay", "deny": true}, {"tool": "pay", "lookup": {"tool": "find"}}]`))
	require.NoError(t, err)
	raw, err = gated.LedgerPolicyOver("shop", inForce)
	require.NoError(t, err)
	var got ledger.Policy
	require.NoError(t, json.Unmarshal(raw, &got))
	assert.Len(t, got.Rules, 4, "the file's rules alone: %s", raw)
	assert.Empty(t, got.SelfApproval)
	assert.Equal(t, &ledger.ReconcileRule{Allow: true}, got.Rules[2].Reconcile, "a lookup without reconcile allows it, settling by default")

	// The namespace's own members (retention, archive) stay whatever the file sets.
	own, err := ledger.ParsePolicy([]byte(`{"rules": [{"tool": "x", "deny": true}], "payloads": "committed",
		"retention": {"payloads_ms": 60000}, "archive": {"keep_ms": 86400000, "min_keep_ms": 60000}}`))
	require.NoError(t, err)
	for _, file := range []policy.Policy{lookups, gated} {
		raw, err = file.LedgerPolicyOver("shop", own)
		require.NoError(t, err)
		var kept ledger.Policy
		require.NoError(t, json.Unmarshal(raw, &kept))
		assert.Equal(t, own.Retention, kept.Retention, "%s", raw)
		assert.Equal(t, own.Archive, kept.Archive, "%s", raw)
	}

	plain, err := policy.Parse([]byte(`[{"tool": "pay", "effect": "write"}]`))
	require.NoError(t, err)
	raw, err = plain.LedgerPolicyOver("shop", inForce)
	require.NoError(t, err)
	assert.Nil(t, raw, "no lookup, no gate: the policy in force stays")
}
