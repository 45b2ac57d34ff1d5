package template_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/mcpgate/template"
)

func TestRender(t *testing.T) {
	vars := template.Vars{Key: "dk_abc", Arguments: map[string]json.RawMessage{
		"order": json.RawMessage(`"A1"`), "amount": json.RawMessage(`12.5`), "tags": json.RawMessage(`["x","y"]`)}}
	for _, tc := range []struct {
		desc, tmpl, want string
		wantErr          error
	}{
		{desc: "key alone is its JSON string", tmpl: `{"idempotency_key": "{{key}}"}`, want: `{"idempotency_key":"dk_abc"}`},
		{desc: "argument alone keeps its JSON type", tmpl: `{"a": "{{arguments.amount}}", "t": "{{arguments.tags}}"}`,
			want: `{"a":12.5,"t":["x","y"]}`},
		{desc: "within text: a string as it is, other values as JSON", tmpl: `{"q": "ref:{{key}}/{{arguments.order}}/{{arguments.amount}}"}`,
			want: `{"q":"ref:dk_abc/A1/12.5"}`},
		{desc: "nested values, member names untouched", tmpl: `{"{{key}}": [{"o": "{{arguments.order}}"}, 1, true, null]}`,
			want: `{"{{key}}":[{"o":"A1"},1,true,null]}`},
		{desc: "no placeholder", tmpl: `{"n": 9007199254740993}`, want: `{"n":9007199254740993}`},
		{desc: "missing argument", tmpl: `{"o": "{{arguments.nope}}"}`, wantErr: template.ErrMissing},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			got, err := template.Render(json.RawMessage(tc.tmpl), vars)
			if tc.wantErr != nil {
				assert.True(t, errors.Is(err, tc.wantErr), "got %v, want %v", err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.JSONEq(t, tc.want, string(got))
		})
	}
}

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		desc, tmpl string
		wantErr    bool
	}{
		{desc: "OK", tmpl: `{"k": "{{key}}", "o": "x {{arguments.order}}"}`},
		{desc: "ErrUnknownPlaceholder", tmpl: `{"k": "{{keys}}"}`, wantErr: true},
		{desc: "ErrNoName", tmpl: `{"k": "{{arguments.}}"}`, wantErr: true},
		{desc: "ErrUnclosed", tmpl: `{"k": "{{key"}`, wantErr: true},
		{desc: "ErrNotJSON", tmpl: `{"k": `, wantErr: true},
		{desc: "ErrTrailing", tmpl: `{} {}`, wantErr: true},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			err := template.Check(json.RawMessage(tc.tmpl))
			assert.Equal(t, tc.wantErr, err != nil, "got %v", err)
		})
	}
}

func TestUses(t *testing.T) {
	assert.True(t, template.Uses(json.RawMessage(`{"a": ["ref-{{key}}"]}`), template.Key))
	assert.False(t, template.Uses(json.RawMessage(`{"order": "{{arguments.order}}", "{{key}}": 1}`), template.Key),
		"a member name is not a placeholder")
	assert.True(t, template.Uses(json.RawMessage(`{"order": "{{arguments.order}}"}`), "arguments.order"))
}
