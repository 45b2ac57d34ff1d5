package storetest

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit"
)

// switchRules gates pay.* behind an approval and refuses an unchanged
// retry of anything.
const switchRules = `"rules":[{"tool":"pay.*","approval":"required"},{"tool":"*","repeat_failure":"refuse"}]`

// RunPayloadSwitch: an inline namespace switched to committed payloads by
// a policy (SPEC §14) keeps what its earlier keys recorded and compares
// with it like with like: an ask made before the switch is consumed after
// it with the ask's sha256: fingerprint, a failure before it refuses an
// unchanged retry of a new key after it (whose fingerprint is keyed), and
// the receipts after it are committed.
func RunPayloadSwitch(t *testing.T, f Factory) {
	ctx := context.Background()
	l, _ := open(t, f)
	require.NoError(t, l.CreateNamespace(ctx, "sw", ledger.NamespaceSettings{Payloads: ledger.PayloadsInline}))
	n := ns(t, l, "sw")
	setPolicy(t, n, `{`+switchRules+`}`)
	pay := gateReq("pay-key-0001", "exec-1", "pay.x")
	pay.Input = json.RawMessage(`{"amount":5}`)
	a := testkit.MustReserve(t, n, pay)
	require.NotNil(t, a.Ask, "asked before the switch")
	mail := gateReq("fail-key-0001", "exec-1", "mail.send")
	mail.Input = json.RawMessage(`{"to":"x"}`)
	failed := testkit.MustReserve(t, n, mail)
	testkit.MustCommit(t, n, testkit.Fail("fail-key-0001", failed.Reservation, false))

	res, err := n.SetPolicy(ctx, json.RawMessage(`{`+switchRules+`,"payloads":"committed"}`), "ops")
	require.NoError(t, err)
	mode, at, err := n.PayloadsNow(ctx)
	require.NoError(t, err)
	assert.Equal(t, ledger.PayloadsCommitted, mode)
	assert.Equal(t, res.Seq, at)

	answer(t, n, a.Ask.Seq, ledger.DecisionApprove)
	r := testkit.MustReserve(t, n, pay)
	require.Equal(t, ledger.StatusReserved, r.Status, "the approval asked before the switch is consumed")
	require.NotNil(t, r.Approval)
	fp, err := ledger.Fingerprint(pay.Input)
	require.NoError(t, err)
	c := testkit.MustCommit(t, n, testkit.Succeed("pay-key-0001", r.Reservation))
	rc, err := n.GetReceipt(ctx, c.Receipt.Seq)
	require.NoError(t, err)
	assert.Equal(t, fp, rc.InputHash, "the key keeps the fingerprint its ask recorded")
	assert.True(t, chain.IsCommitment(rc.Field(chain.FieldResult)), "a commit after the switch is committed: %q", rc.Field(chain.FieldResult))

	again := gateReq("fail-key-0002", "exec-2", "mail.send")
	again.Input = mail.Input
	_, err = n.Reserve(ctx, again)
	assert.Equal(t, ledger.ECodeUnchangedRetry, code(err), "the failure before the switch counts")
	again.Changed = &ledger.Changed{Strategy: "other"}
	nr := testkit.MustReserve(t, n, again)
	v := keyView(t, n, "fail-key-0002")
	assert.True(t, strings.HasPrefix(v.InputHash, ledger.KeyedHashPrefix), v.InputHash)
	assert.Equal(t, ledger.StatusReserved, nr.Status)

	// The policy recorded after the switch says so; inline is refused.
	res, err = n.SetPolicy(ctx, json.RawMessage(`{`+switchRules+`}`), "ops")
	require.NoError(t, err)
	assert.False(t, res.Changed, "the same policy: the member is implied")
	_, err = n.SetPolicy(ctx, json.RawMessage(`{"payloads":"inline"}`), "ops")
	assert.Equal(t, ledger.ECodeInvalidRequest, code(err))
}
