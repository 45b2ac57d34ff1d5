package mcpgate_test

import (
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/mcpgate"
)

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
