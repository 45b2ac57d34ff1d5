package mcpgate_test

import (
	"encoding/json"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/mcpgate"
)

func ptr(b bool) *bool { return &b }

func TestClassify(t *testing.T) {
	policy, err := mcpgate.ParsePolicy([]byte(`[
		{"tool": "search_*", "effect": "read"},
		{"tool": "shop.set_flag", "effect": "write", "idempotent": true}
	]`))
	require.NoError(t, err)
	for _, tc := range []struct {
		desc string
		tool string
		ann  *mcp.ToolAnnotations
		want mcpgate.Class
	}{
		{"NoAnnotations", "charge", nil, mcpgate.Class{Effect: "destructive"}},
		{"EmptyAnnotations", "charge", &mcp.ToolAnnotations{}, mcpgate.Class{Effect: "destructive"}},
		{"ReadOnly", "get", &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true}, mcpgate.Class{Effect: "read"}},
		{"NotDestructiveOpenWorldDefault", "mail", &mcp.ToolAnnotations{DestructiveHint: ptr(false)},
			mcpgate.Class{Effect: "external"}},
		{"ClosedWorld", "note", &mcp.ToolAnnotations{DestructiveHint: ptr(false), OpenWorldHint: ptr(false)},
			mcpgate.Class{Effect: "write"}},
		{"IdempotentDestructive", "delete", &mcp.ToolAnnotations{IdempotentHint: true, OpenWorldHint: ptr(false)},
			mcpgate.Class{Effect: "destructive", Idempotent: true}},
		{"PolicyGlob", "search_web", nil, mcpgate.Class{Effect: "read"}},
		{"PolicyLedgerName", "set_flag", &mcp.ToolAnnotations{ReadOnlyHint: true},
			mcpgate.Class{Effect: "write", Idempotent: true}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			got := mcpgate.Classify(policy, tc.tool, "shop."+tc.tool, tc.ann)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, got.Effect != "read", got.Recorded())
		})
	}
}

// TestClassify_starCoversSlash: a "*" rule covers every tool name, one
// with a "/" too (path.Match's "*" stops at "/", so an upstream's
// "admin/delete" claiming readOnlyHint slipped past it).
func TestClassify_starCoversSlash(t *testing.T) {
	policy, err := mcpgate.ParsePolicy([]byte(`[{"tool": "*", "effect": "destructive"}]`))
	require.NoError(t, err)
	for _, name := range []string{"admin/delete", "a/b/c", "x.y/z"} {
		got := mcpgate.Classify(policy, name, "shop."+name, &mcp.ToolAnnotations{ReadOnlyHint: true})
		assert.Equal(t, mcpgate.Class{Effect: "destructive"}, got, name)
	}
}

// TestClassify_onErrorRule: a rule whose only member is on_error is a rule
// of its own: the class still comes from the annotations (or a later rule
// with an effect), and on_error from the first matching rule that sets it.
func TestClassify_onErrorRule(t *testing.T) {
	policy, err := mcpgate.ParsePolicy([]byte(`[
		{"tool": "batch_*", "on_error": "failed"},
		{"tool": "batch_send", "effect": "external", "idempotent": true},
		{"tool": "note", "effect": "write"},
		{"tool": "*", "on_error": "not_applied"},
		{"tool": "note", "on_error": "failed"}
	]`))
	require.NoError(t, err)
	closed := &mcp.ToolAnnotations{DestructiveHint: ptr(false), OpenWorldHint: ptr(false)}
	for _, tc := range []struct {
		tool string
		ann  *mcp.ToolAnnotations
		want mcpgate.Class
	}{
		{"batch_write", closed, mcpgate.Class{Effect: "write", OnError: "failed"}},
		{"batch_send", nil, mcpgate.Class{Effect: "external", Idempotent: true, OnError: "failed"}},
		{"note", nil, mcpgate.Class{Effect: "write", OnError: "not_applied"}},
		{"other", nil, mcpgate.Class{Effect: "destructive", OnError: "not_applied"}},
		{"batch_read", &mcp.ToolAnnotations{ReadOnlyHint: true}, mcpgate.Class{Effect: "read"}},
	} {
		assert.Equal(t, tc.want, mcpgate.Classify(policy, tc.tool, "shop."+tc.tool, tc.ann), tc.tool)
	}
	assert.False(t, policy.HasGate(), "on_error is no member of the ledger's gate")

	_, err = mcpgate.ParsePolicy([]byte(`[{"tool": "a", "idempotent": true}]`))
	require.Error(t, err)
	assert.Contains(t, err.Error(), `no "effect", no "on_error" and no member of the gate`)
	_, err = mcpgate.ParsePolicy([]byte(`[{"tool": "a", "on_error": "sometimes"}]`))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "on_error")
}

// TestLedgerPolicy: the gate's members become the ledger's policy with
// rules that match the same ledger names as the file's rules, which match
// a tool's own name or its ledger name <server-name>.<tool>.
func TestLedgerPolicy(t *testing.T) {
	p, err := mcpgate.ParsePolicy([]byte(`{"rules": [
		{"tool": "search_*", "effect": "read"},
		{"tool": "charge", "effect": "external", "approval": "required", "approvers": ["mcp-client"], "expires_in_ms": 60000},
		{"tool": "my_shop.rm*", "deny": true},
		{"tool": "*", "repeat_failure": "refuse"}
	], "self_approval": "allow"}`))
	require.NoError(t, err)
	require.True(t, p.HasGate())
	raw, err := p.LedgerPolicy("my shop")
	require.NoError(t, err)
	assert.JSONEq(t, `{"rules": [
		{"tool": "charge", "approval": "required", "approvers": ["mcp-client"], "expires_in_ms": 60000},
		{"tool": "my_shop.charge", "approval": "required", "approvers": ["mcp-client"], "expires_in_ms": 60000},
		{"tool": "my_shop.rm*", "deny": true},
		{"tool": "my_shop.my_shop.rm*", "deny": true},
		{"tool": "*", "repeat_failure": "refuse"}
	], "self_approval": "allow"}`, string(raw))
	lp, err := ledger.ParsePolicy(raw)
	require.NoError(t, err)
	for tool, want := range map[string]bool{"my_shop.charge": true, "charge": true, "myXshop.charge": false, "my_shop.charge2": false} {
		assert.Equal(t, want, lp.GateFor(tool, "external").Approval, tool)
	}
	assert.True(t, lp.GateFor("my_shop.rm_rf", "destructive").Deny, "the upstream's tool rm_rf by its ledger name")
	assert.True(t, lp.GateFor("my_shop.my_shop.rm_rf", "destructive").Deny, "the upstream's tool my_shop.rm_rf")
	assert.False(t, lp.GateFor("my_shop.shop.rm_rf", "destructive").Deny)
	assert.True(t, lp.GateFor("my_shop.lookup", "write").RepeatRefuse)
	// The classification skips rules of the gate only.
	assert.Equal(t, mcpgate.Class{Effect: "external"}, mcpgate.Classify(p, "charge", "my_shop.charge", nil))
	assert.Equal(t, mcpgate.Class{Effect: "destructive"}, mcpgate.Classify(p, "rm_rf", "my_shop.rm_rf", nil))

	plain, err := mcpgate.ParsePolicy([]byte(`[{"tool": "a", "effect": "write"}]`))
	require.NoError(t, err)
	assert.False(t, plain.HasGate())
	raw, err = plain.LedgerPolicy("s")
	require.NoError(t, err)
	assert.Nil(t, raw)
}

// TestFingerprintIsTheLedgers: the gateway's fingerprint of a call's
// arguments is the one the ledger computes from the input it is sent.
func TestFingerprintIsTheLedgers(t *testing.T) {
	for _, args := range []string{`{}`, `{"b": 1, "a": [1.0, "x\u00e9"]}`, `{"n": 1e21, "s": "\ud83d\ude00"}`} {
		a, err := client.Fingerprint(json.RawMessage(args))
		require.NoError(t, err)
		b, err := ledger.Fingerprint([]byte(args))
		require.NoError(t, err)
		assert.Equal(t, b, a, args)
	}
}
