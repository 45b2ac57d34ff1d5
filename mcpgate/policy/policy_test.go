package policy_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/mcpgate/policy"
)

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
		{"NotAListNorPolicy", `{"tool":"a"}`, "unknown field"},
		{"NotJSON", `"a"`, "cannot unmarshal"},
		{"Object", `{"rules":[{"tool":"a","effect":"write","approval":"required","approvers":["mcp-client"]}],"self_approval":"allow"}`, ""},
		{"GateOnly", `[{"tool":"a","deny":true}]`, ""},
		{"NoEffectNoGate", `[{"tool":"a","idempotent":true}]`, "no \"effect\""},
		{"BadApproval", `[{"tool":"a","approval":"maybe"}]`, `approval must be "required" or "none"`},
		{"BadExpiry", `[{"tool":"a","approval":"required","expires_in_ms":5}]`, "expires_in_ms"},
		{"BadRepeat", `[{"tool":"a","repeat_failure":"sometimes"}]`, "repeat_failure"},
		{"BadSelfApproval", `{"rules":[],"self_approval":"maybe"}`, "self_approval"},
		{"GatedRead", `[{"tool":"a","effect":"read","approval":"required"}]`, "never sees"},
		{"Trailing", `[] []`, "trailing"},
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
