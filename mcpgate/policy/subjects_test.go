package policy_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/mcpgate/policy"
)

// TestRuleSubjects: a rule's subjects are checked when the policy loads,
// and the first matching rule that sets them gives a call's templates.
func TestRuleSubjects(t *testing.T) {
	for _, tc := range []struct{ desc, in, wantErr string }{
		{"SubjectsOnly", `[{"tool":"crm.*","subjects":["{{arguments.customer_id}}","team-{{arguments.team}}"]}]`, ""},
		{"WithEffect", `[{"tool":"a","effect":"write","subjects":["{{arguments.c}}"]}]`, ""},
		{"TooMany", `[{"tool":"a","subjects":["1","2","3","4","5","6","7","8","9"]}]`, "at most 8"},
		{"Empty", `[{"tool":"a","subjects":[""]}]`, "subjects[0]: empty"},
		{"NotAString", `[{"tool":"a","subjects":[1]}]`, "cannot unmarshal"},
		{"BadPlaceholder", `[{"tool":"a","subjects":["{{args.c}}"]}]`, "subjects[0]"},
		{"Unclosed", `[{"tool":"a","subjects":["{{arguments.c"]}]`, "subjects[0]"},
		{"Read", `[{"tool":"a","effect":"read","subjects":["{{arguments.c}}"]}]`, "not recorded"},
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
	p, err := policy.Parse([]byte(`[{"tool":"other","subjects":["x"]},{"tool":"crm.*","effect":"write"},{"tool":"crm.*","subjects":["{{arguments.id}}"]},{"tool":"*","subjects":["late"]}]`))
	require.NoError(t, err)
	assert.Equal(t, []string{"{{arguments.id}}"}, p.Subjects("crm.upsert", "srv.crm.upsert"))
	assert.Equal(t, []string{"late"}, p.Subjects("mail", "srv.mail"))
}

// TestRenderSubject: a string argument as it is, a number as its JSON
// text; a missing argument, one of another type, or a text that is no
// subject leaves the subject out, and the error names the template,
// never a value.
func TestRenderSubject(t *testing.T) {
	secret := "zoe@example.com-" + strings.Repeat("x", 120)
	args := json.RawMessage(`{"customer_id":"cust-42","n":1234567890123456789012,"neg":-7,"flag":true,"obj":{"a":"zoe"},"none":null,"empty":"","long":"` + secret + `"}`)
	for _, tc := range []struct{ tmpl, want string }{
		{"{{arguments.customer_id}}", "cust-42"},
		{"{{arguments.n}}", "1234567890123456789012"},
		{"{{arguments.neg}}", "-7"},
		{"c:{{arguments.customer_id}}/{{arguments.neg}}", "c:cust-42/-7"},
		{"{{key}}", "dk_1"},
		{"fixed", "fixed"},
	} {
		got, err := policy.RenderSubject(tc.tmpl, "dk_1", args)
		require.NoError(t, err, tc.tmpl)
		assert.Equal(t, tc.want, got, tc.tmpl)
	}
	for _, tmpl := range []string{"{{arguments.missing}}", "{{arguments.flag}}", "{{arguments.obj}}", "{{arguments.none}}",
		"{{arguments.empty}}", "{{arguments.long}}", "x-{{arguments.obj}}"} {
		_, err := policy.RenderSubject(tmpl, "dk_1", args)
		require.ErrorIs(t, err, policy.ErrSubjectLeftOut, tmpl)
		assert.Contains(t, err.Error(), tmpl)
		assert.NotContains(t, err.Error(), "zoe", "the error never quotes a value")
	}
}
