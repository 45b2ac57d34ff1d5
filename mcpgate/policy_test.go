package mcpgate_test

import (
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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

func TestParsePolicy(t *testing.T) {
	for _, tc := range []struct {
		desc    string
		in      string
		wantErr string
	}{
		{"OK", `[{"tool":"a*","effect":"none"}]`, ""},
		{"UnknownField", `[{"tool":"a","effect":"read","idempotnet":true}]`, "unknown field"},
		{"BadClass", `[{"tool":"a","effect":"effectful"}]`, "not one of"},
		{"EmptyTool", `[{"effect":"read"}]`, "empty"},
		{"BadGlob", `[{"tool":"a[","effect":"read"}]`, "not closed"},
		{"NotAList", `{"tool":"a"}`, "cannot unmarshal"},
		{"Trailing", `[] []`, "trailing"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			_, err := mcpgate.ParsePolicy([]byte(tc.in))
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
		})
	}
}
