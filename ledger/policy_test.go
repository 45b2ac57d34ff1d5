package ledger_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// TestPolicy_firstRuleThatSetsEachMember: SPEC §13's example — the `*`
// rule adds the repeat guard to payments, and self-approval defaults to
// deny.
func TestPolicy_firstRuleThatSetsEachMember(t *testing.T) {
	p, err := ledger.ParsePolicy([]byte(`{"rules":[
		{"tool":"payments.*","approval":"required","approvers":["role:approver"],"expires_in_ms":3600000},
		{"tool":"shell.rm*","deny":true},
		{"tool":"*","repeat_failure":"refuse","repeat_window_ms":86400000}]}`))
	require.NoError(t, err)
	g := p.GateFor("payments.charge", "external")
	assert.True(t, g.Approval)
	assert.True(t, g.RepeatRefuse)
	assert.False(t, g.Deny)
	assert.False(t, g.SelfApproval)
	assert.Equal(t, uint64(3600000), g.ExpiresInMS)
	assert.True(t, g.Lists("alice", ledger.RoleApprover))
	assert.True(t, g.Lists("ops", ledger.RoleAdmin), "an admin counts as role:approver")
	assert.False(t, g.Lists("agent", ledger.RoleWriter))
	d := p.GateFor("shell.rm/rf", "destructive")
	assert.True(t, d.Deny, "* matches / too")
	assert.Equal(t, 1, d.DenyRule)
	n := p.GateFor("search.web", "write")
	assert.False(t, n.Gates())
	assert.True(t, n.RepeatRefuse)
}

// TestPolicy_refusals: a bad member is named.
func TestPolicy_refusals(t *testing.T) {
	for raw, field := range map[string]string{
		`{"rules":[{"tool":"x","approval":"maybe"}]}`:    "rules[0].approval",
		`{"rules":[{"tool":""}]}`:                        "rules[0].tool",
		`{"rules":[{"tool":"[a-"}]}`:                     "rules[0].tool",
		`{"rules":[{"tool":"x","effect":"read"}]}`:       "rules[0].effect",
		`{"rules":[{"tool":"x","expires_in_ms":5}]}`:     "rules[0].expires_in_ms",
		`{"rules":[{"tool":"x","repeat_failure":"no"}]}`: "rules[0].repeat_failure",
		`{"self_approval":"sometimes"}`:                  "self_approval",
		`{"rules":[{"tool":"x","approvers":[""]}]}`:      "rules[0].approvers",
		`{"rules":[{"tool":"x","repeat_window_ms":0}]}`:  "rules[0].repeat_window_ms",
		`{"rules":[{"tool":"x","color":"red"}]}`:         "rules[0].color",
		`{"rules":[]} {}`:                                "policy",
		`{"rules":[{"tool":"x","deny":"yes"}]}`:          "rules[0].deny",
		`{"payloads":"inline"}`:                          "payloads",
		`{"payloads":"sealed"}`:                          "payloads",
		`{"payloads":true}`:                              "payloads",
	} {
		_, err := ledger.ParsePolicy([]byte(raw))
		var e *ledger.Error
		require.ErrorAs(t, err, &e, raw)
		assert.Equal(t, ledger.ECodeInvalidRequest, e.Code, raw)
		assert.Equal(t, field, e.Details["field"], raw)
	}
}

// FuzzParsePolicy: any text either is refused with invalid_request or
// parses into a policy whose canonical text parses again to the same
// canonical text, and whose gate never panics.
func FuzzParsePolicy(f *testing.F) {
	for _, s := range []string{`{}`, `{"rules":[{"tool":"payments.*","approval":"required"}]}`,
		`{"rules":[{"tool":"a?[bc]\\*","deny":true,"effect":"write"}],"self_approval":"allow"}`,
		`{"rules":[{"tool":"*","repeat_failure":"refuse","repeat_window_ms":1}]}`, `null`, `[]`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		p, err := ledger.ParsePolicy([]byte(raw))
		if err != nil {
			var e *ledger.Error
			if !assert.ErrorAs(t, err, &e) || e.Code != ledger.ECodeInvalidRequest {
				t.Fatalf("%q: not an invalid_request: %v", raw, err)
			}
			return
		}
		c, err := p.Canonical()
		require.NoError(t, err)
		q, err := ledger.ParsePolicy([]byte(c))
		require.NoError(t, err, "canonical text %q", c)
		c2, err := q.Canonical()
		require.NoError(t, err)
		require.Equal(t, c, c2)
		_ = q.GateFor("payments.charge", "external")
	})
}

// TestPolicy_reconcile: the reconcile member (SPEC §15) is taken from the
// first matching rule that sets it; settle_ms defaults to 60 s; its
// canonical text keeps what was set.
func TestPolicy_reconcile(t *testing.T) {
	p, err := ledger.ParsePolicy([]byte(`{"rules":[
		{"tool":"payments.refund","reconcile":{"allow":false}},
		{"tool":"payments.*","reconcile":{"allow":true,"settle_ms":0}},
		{"tool":"*","reconcile":{"allow":true}}]}`))
	require.NoError(t, err)
	assert.False(t, p.GateFor("payments.refund", "write").Reconcile)
	g := p.GateFor("payments.charge", "external")
	assert.True(t, g.Reconcile)
	assert.Equal(t, uint64(0), g.SettleMS)
	m := p.GateFor("email.send", "external")
	assert.True(t, m.Reconcile)
	assert.Equal(t, uint64(ledger.DefaultSettleMS), m.SettleMS)
	assert.False(t, (*ledger.Policy)(nil).GateFor("x", "write").Reconcile, "no policy allows nothing")
	c, err := p.Canonical()
	require.NoError(t, err)
	assert.Contains(t, c, `{"reconcile":{"allow":true,"settle_ms":0},"tool":"payments.*"}`)
	assert.Contains(t, c, `{"reconcile":{"allow":true},"tool":"*"}`)
	for raw, field := range map[string]string{
		`{"rules":[{"tool":"x","reconcile":{"allow":"yes"}}]}`:                       "rules[0].reconcile.allow",
		`{"rules":[{"tool":"x","reconcile":{"allow":true,"settle_ms":-1}}]}`:         "rules[0].reconcile.settle_ms",
		`{"rules":[{"tool":"x","reconcile":{"allow":true,"settle_ms":2592000001}}]}`: "rules[0].reconcile.settle_ms",
		`{"rules":[{"tool":"x","reconcile":true}]}`:                                  "rules[0].reconcile",
		`{"rules":[{"tool":"x","reconcile":{"allow":true,"lookup":"y"}}]}`:           "rules[0].reconcile.lookup",
	} {
		_, err := ledger.ParsePolicy([]byte(raw))
		var e *ledger.Error
		require.ErrorAs(t, err, &e, raw)
		assert.Equal(t, field, e.Details["field"], raw)
	}
}

// TestParsePolicy_archive: the archive member (SPEC §16) needs both of
// its members, 60,000 ≤ min_keep_ms ≤ keep_ms ≤ 2^53−1, and nothing else;
// its canonical text keeps both.
func TestParsePolicy_archive(t *testing.T) {
	p, err := ledger.ParsePolicy([]byte(`{"archive":{"min_keep_ms":60000,"keep_ms":2592000000}}`))
	require.NoError(t, err)
	assert.Equal(t, &ledger.Archive{KeepMS: 2592000000, MinKeepMS: 60000}, p.Archive)
	assert.False(t, p.Empty())
	text, err := p.Canonical()
	require.NoError(t, err)
	assert.Equal(t, `{"archive":{"keep_ms":2592000000,"min_keep_ms":60000}}`, text)
	p, err = ledger.ParsePolicy([]byte(`{"archive":null}`))
	require.NoError(t, err)
	assert.True(t, p.Empty(), "null is no member")
	for raw, field := range map[string]string{
		`{"archive":{"keep_ms":86400000}}`:                             "archive.min_keep_ms",
		`{"archive":{"min_keep_ms":86400000}}`:                         "archive.keep_ms",
		`{"archive":{"keep_ms":86400000,"min_keep_ms":59999}}`:         "archive.min_keep_ms",
		`{"archive":{"keep_ms":60000,"min_keep_ms":60001}}`:            "archive.keep_ms",
		`{"archive":{"keep_ms":9007199254740992,"min_keep_ms":60000}}`: "archive.keep_ms",
		`{"archive":{"keep_ms":-1,"min_keep_ms":60000}}`:               "archive.keep_ms",
		`{"archive":{"keep_ms":"1d","min_keep_ms":60000}}`:             "archive.keep_ms",
		`{"archive":{"keep_ms":86400000,"min_keep_ms":60000,"x":1}}`:   "archive.x",
		`{"archive":true}`: "archive",
	} {
		_, err := ledger.ParsePolicy([]byte(raw))
		var e *ledger.Error
		require.ErrorAs(t, err, &e, raw)
		assert.Equal(t, field, e.Details["field"], raw)
	}
}

// TestSwitchesPayloads: only a JSON object whose member "payloads" (that
// exact name) is "committed" switches a namespace (SPEC §14).
func TestSwitchesPayloads(t *testing.T) {
	for _, tc := range []struct {
		desc, text string
		want       bool
	}{
		{"the member", `{"payloads":"committed"}`, true},
		{"beside others", `{"retention":{"payloads_ms":60000},"payloads":"committed","rules":[]}`, true},
		{"inline", `{"payloads":"inline"}`, false},
		{"another name's case", `{"Payloads":"committed"}`, false},
		{"not a string", `{"payloads":1}`, false},
		{"omitted", `{"rules":[]}`, false},
		{"not an object", `["payloads","committed"]`, false},
		{"not JSON", `payloads: committed`, false},
	} {
		assert.Equal(t, tc.want, ledger.SwitchesPayloads(tc.text), tc.desc)
	}
}
