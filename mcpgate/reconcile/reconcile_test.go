package reconcile_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"

	"github.com/effect-ledger/effect-ledger/mcpgate/reconcile"
)

func TestJudge(t *testing.T) {
	big := `{"applied": true, "external_ref": "r", "pad": "` + strings.Repeat("x", reconcile.MaxAnswer) + `"}`
	for _, tc := range []struct {
		desc, raw string
		byKey     bool
		want      reconcile.Finding
		wantErr   bool
	}{
		{desc: "OK applied", raw: `{"content": [], "structuredContent": {"applied": true, "external_ref": "pay_1", "amount": 5}}`,
			want: reconcile.Finding{Applied: true, ExternalRef: "pay_1", Answer: json.RawMessage(`{"applied":true,"external_ref":"pay_1","amount":5}`)}},
		{desc: "OK applied, asked by other arguments", raw: `{"structuredContent": {"applied": true, "external_ref": "pay_1"}}`,
			want: reconcile.Finding{Applied: true, ExternalRef: "pay_1", Answer: json.RawMessage(`{"applied":true,"external_ref":"pay_1"}`)}},
		{desc: "OK not applied by key", raw: `{"structuredContent": {"applied": false}}`, byKey: true,
			want: reconcile.Finding{Answer: json.RawMessage(`{"applied":false}`)}},
		{desc: "ErrNotAppliedByOtherArguments", raw: `{"structuredContent": {"applied": false}}`, wantErr: true},
		{desc: "ErrAppliedWithoutRef", raw: `{"structuredContent": {"applied": true}}`, byKey: true, wantErr: true},
		{desc: "ErrAppliedEmptyRef", raw: `{"structuredContent": {"applied": true, "external_ref": ""}}`, byKey: true, wantErr: true},
		{desc: "ErrAppliedNotBool", raw: `{"structuredContent": {"applied": "yes", "external_ref": "r"}}`, byKey: true, wantErr: true},
		{desc: "ErrNoStructuredContent", raw: `{"content": [{"type": "text", "text": "{\"applied\": true}"}]}`, byKey: true, wantErr: true},
		{desc: "ErrOtherAnswer", raw: `{"structuredContent": {"status": "pending"}}`, byKey: true, wantErr: true},
		{desc: "ErrIsError", raw: `{"isError": true, "structuredContent": {"applied": false}}`, byKey: true, wantErr: true},
		{desc: "ErrNotObject", raw: `{"structuredContent": [true]}`, byKey: true, wantErr: true},
		{desc: "ErrTooLarge", raw: `{"structuredContent": ` + big + `}`, byKey: true, wantErr: true},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			got, err := reconcile.Judge(json.RawMessage(tc.raw), tc.byKey)
			if tc.wantErr {
				assert.True(t, errors.Is(err, reconcile.ErrNoEvidence), "got %v, want ErrNoEvidence", err)
				return
			}
			assert.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestCheckTool(t *testing.T) {
	assert.NoError(t, reconcile.CheckTool("find", &mcp.Tool{Name: "find", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}))
	assert.ErrorContains(t, reconcile.CheckTool("find", &mcp.Tool{Name: "find"}), "readOnlyHint")
	assert.ErrorContains(t, reconcile.CheckTool("find", nil), "not one of the upstream's tools")
}
