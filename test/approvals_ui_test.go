package test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// uiApprovalPolicy sends payments.* to a person, with an hour to answer.
const uiApprovalPolicy = `{"rules":[
 {"tool":"payments.*","approval":"required","approvers":["role:approver"],"expires_in_ms":3600000}],
 "self_approval":"deny"}`

// loginTab opens the page at hash in a new tab and gives it token through
// the page's own prompt.
func loginTab(t *testing.T, browser context.Context, url, token, hash string) *tab {
	t.Helper()
	b := newTab(t, browser)
	b.do(chromedp.Navigate(url + "/ui/" + hash))
	b.wait(`!document.querySelector('#login').hidden`)
	b.do(chromedp.SetValue(chromedp.CSS("#token"), token),
		chromedp.Click(chromedp.CSS("#login-form button[type=submit]")))
	b.wait(`document.querySelector('#login').hidden && !document.querySelector('#main').hidden`)
	return b
}

// openAsk opens the ask at seq from the list the tab shows.
func (b *tab) openAsk(seq int64) {
	b.t.Helper()
	b.do(chromedp.Click(chromedp.CSS(fmt.Sprintf(`#approvals-table tr[data-seq="%d"] td:first-child a`, seq))))
	b.wait(fmt.Sprintf(`location.hash.startsWith('#approvals/%d') && document.querySelector('#approval-title').textContent === 'Ask #%d' && document.querySelector('#approval-tool')`, seq, seq))
}

// answerAsk types note and presses the decision's button.
func (b *tab) answerAsk(decision, note string) {
	b.t.Helper()
	b.wait(`!document.querySelector('#approval-form').hidden`)
	if note != "" { // chromedp's SetValue cannot set ""; the note starts empty
		b.do(chromedp.SetValue(chromedp.CSS("#approval-note"), note))
	}
	b.do(chromedp.Click(chromedp.CSS("#approval-" + decision)))
}

// TestUI_approvals drives the Approvals view in a real headless Chromium
// against the real ledgerd: an approver sees the pending asks (hostile
// strings as text), the asked input and the policy, approves and rejects
// through the page, and the writer's next reserve consumes the approval
// or meets the rejection. The server's refusals (forbidden, self_approval,
// already_answered, approval_expired) show in the page, and an input past
// its retention shows as deleted.
func TestUI_approvals(t *testing.T) {
	t.Parallel()
	browser := newBrowser(t)
	clock := newWallClock(t)
	f := newGateFixture(t, clock, filepath.Join(t.TempDir(), "ledger.db"))
	r := f.l.Do("PUT", "/v1/namespaces/default/policy", uiApprovalPolicy, f.as(f.admin)...)
	require.Equal(t, 200, r.Status, r.Raw)
	pol := f.l.Do("GET", "/v1/namespaces/default/policy", "", f.as(f.reader)...)
	require.Equal(t, 200, pol.Status, pol.Raw)
	policyJSON, err := json.Marshal(pol.Body["policy"])
	require.NoError(t, err)

	// The asks: one full of HTML (tool, summary, input), one to reject, one
	// the admin made itself.
	hostileTool := "payments." + hostileKey
	summary := hostileText + " charge 12.00 to acct_9"
	const input1 = `{"amount":1200,"to":"acct_9","memo":"<script>alert(4)</script>"}`
	a1 := f.reserve(f.agent, "pay-key-0001", "exec-1", hostileTool, input1, fmt.Sprintf(`,"approval_summary":%q`, summary))
	require.Equal(t, 202, a1.Status, a1.Raw)
	ask1 := num(t, a1.Body, "approval", "seq")
	a2 := f.reserve(f.agent, "pay-key-0002", "exec-2", "payments.refund", `{"amount":5}`, `,"approval_summary":"refund 0.05"`)
	require.Equal(t, 202, a2.Status, a2.Raw)
	ask2 := num(t, a2.Body, "approval", "seq")
	a3 := f.reserve(f.admin, "pay-key-0003", "exec-3", "payments.charge", `{"amount":6}`, "")
	require.Equal(t, 202, a3.Status, a3.Raw)
	ask3 := num(t, a3.Body, "approval", "seq")
	show1 := f.l.Do("GET", fmt.Sprintf("/v1/approvals/%d", ask1), "", f.as(f.alice)...)
	require.Equal(t, 200, show1.Status, show1.Raw)

	b := loginTab(t, browser, f.l.URL, f.alice, "#approvals")
	assert.Equal(t, f.alice, b.str(`sessionStorage.getItem('effect-ledger.token')`))
	assert.Equal(t, "", b.str(`document.cookie`), "nothing in a cookie")

	// The pending asks, hostile strings as text.
	b.wait(`document.querySelectorAll('#approvals-table tbody tr.row').length === 3`)
	assert.Equal(t, "pending", b.str(`document.querySelector('#ap-state').value`))
	assert.Equal(t, []string{fmt.Sprint(ask1), fmt.Sprint(ask2), fmt.Sprint(ask3)}, b.strs(texts("#approvals-table tbody tr.row td:first-child")))
	assert.Equal(t, []string{hostileTool, "payments.refund", "payments.charge"}, b.strs(texts("#approvals-table tbody tr.row td:nth-child(2)")))
	assert.Equal(t, []string{"pay-key-0001", "pay-key-0002", "pay-key-0003"}, b.strs(texts("#approvals-table tbody tr.row td:nth-child(3)")))
	assert.Equal(t, []string{summary, "refund 0.05", "—"}, b.strs(texts("#approvals-table tbody tr.row td:nth-child(4)")))
	assert.Equal(t, []string{show1.Body["actor"].(string), show1.Body["actor"].(string), askActor(t, f, ask3)}, b.strs(texts("#approvals-table tbody tr.row td:nth-child(5)")))
	assert.Contains(t, b.str(`document.querySelector('#approvals-table tbody tr.row td:nth-child(7)').textContent`), "left)")
	assert.Contains(t, b.str(`document.querySelector('#approvals-table tbody tr.row td:nth-child(8)').textContent`), "exec-1")
	assert.Equal(t, []string{"pending", "pending", "pending"}, b.strs(texts("#approvals-table tbody tr.row td:nth-child(9)")))

	// The policy in force, read-only.
	b.wait(`document.querySelector('#policy-json')`)
	assert.JSONEq(t, string(policyJSON), b.str(`document.querySelector('#policy-json').textContent`))
	assert.Contains(t, b.str(`document.querySelector('#policy-json').textContent`), "\n  \"rules\"", "pretty-printed")
	assert.Equal(t, fmt.Sprintf("set at receipt #%d", num(t, pol.Body, "seq")), b.str(`document.querySelector('#policy-seq').textContent`))

	// The ask opened: its input, verified, and its summary as text.
	b.openAsk(ask1)
	b.wait(`document.querySelector('#approval-input')`)
	assert.Equal(t, hostileTool, b.str(`document.querySelector('#approval-tool').textContent`))
	assert.Equal(t, summary, b.str(`document.querySelector('#approval-summary').textContent`))
	in := b.str(`document.querySelector('#approval-input').textContent`)
	assert.JSONEq(t, input1, in)
	assert.Contains(t, in, `  "memo": "<script>alert(4)</script>"`, "pretty-printed, as text")
	assert.Contains(t, b.str(`document.querySelector('#approval-input-box .badge').textContent`), "verified: matches")
	assert.Equal(t, 0, b.num(`document.querySelectorAll('#approval-answer, #approval-consumer').length`))
	assert.Equal(t, 0, b.num(`document.querySelectorAll('[onerror],[onload]').length`))
	assert.Equal(t, []string{f.l.URL + "/ui/favicon.svg"}, b.strs(`[...document.images].map(i => i.src)`))
	assert.Equal(t, []string{f.l.URL + "/ui/app.js"}, b.strs(`[...document.scripts].map(s => s.src)`))
	b.clean()

	// Approve with a note through the page: the list refreshes.
	note := "ok for acct_9 " + hostileText
	b.answerAsk("approve", note)
	b.wait(`document.querySelector('#approval-answer') && document.querySelectorAll('#approvals-table tbody tr.row').length === 2`)
	assert.Contains(t, b.str(`document.querySelector('#approval-answer').textContent`), "approved by alice (approver)")
	assert.Equal(t, note, b.str(`document.querySelector('#approval-answer-note').textContent`))
	assert.Equal(t, "approved", b.str(`document.querySelector('#approval-detail .key-head .badge').textContent`))
	assert.Equal(t, 1, b.num(`document.querySelector('#approval-form').hidden ? 1 : 0`), "nothing left to answer")
	assert.Equal(t, 1, b.num(`document.querySelector('#approval-error').hidden ? 1 : 0`))
	got := f.l.Do("GET", fmt.Sprintf("/v1/approvals/%d", ask1), "", f.as(f.reader)...)
	require.Equal(t, 200, got.Status, got.Raw)
	assert.Equal(t, "approved", got.Body["state"])
	assert.Equal(t, note, got.Body["answer"].(map[string]any)["note"])
	assert.Equal(t, "alice", got.Body["answer"].(map[string]any)["actor"])

	// The writer's next reserve consumes it.
	c := f.reserve(f.agent, "pay-key-0001", "exec-1", hostileTool, input1, "")
	require.Equal(t, 201, c.Status, c.Raw)
	assert.Equal(t, num(t, got.Body, "answer", "seq"), num(t, c.Body, "approval", "seq"))
	assert.Equal(t, ask1, num(t, c.Body, "approval", "ask_seq"))
	b.do(chromedp.SetValue(chromedp.CSS("#ap-state"), "consumed"),
		chromedp.Click(chromedp.CSS("#approvals-form button[type=submit]")))
	b.wait(`location.hash === '#approvals?state=consumed' && document.querySelectorAll('#approvals-table tbody tr.row').length === 1`)
	b.openAsk(ask1)
	b.wait(`document.querySelector('#approval-consumer')`)
	assert.Equal(t, fmt.Sprintf("reserve #%d by execution exec-1, attempt 1", num(t, c.Body, "receipt", "seq")),
		b.str(`document.querySelector('#approval-consumer').textContent`))
	assert.Equal(t, "consumed", b.str(`document.querySelector('#approval-detail .key-head .badge').textContent`))
	b.clean()

	// Reject through the page: the writer's reserve meets the rejection.
	b.goHash("#approvals")
	b.wait(`location.hash === '#approvals' && document.querySelectorAll('#approvals-table tbody tr.row').length === 2`)
	b.openAsk(ask2)
	b.answerAsk("reject", "not this one")
	b.wait(`document.querySelector('#approval-answer') && document.querySelectorAll('#approvals-table tbody tr.row').length === 1`)
	assert.Contains(t, b.str(`document.querySelector('#approval-answer').textContent`), "rejected by alice (approver)")
	assert.Equal(t, "rejected", b.str(`document.querySelector('#approval-detail .key-head .badge').textContent`))
	got = f.l.Do("GET", fmt.Sprintf("/v1/approvals/%d", ask2), "", f.as(f.reader)...)
	require.Equal(t, 200, got.Status, got.Raw)
	assert.Equal(t, "rejected", got.Body["state"])
	rr := f.reserve(f.agent, "pay-key-0002", "exec-2", "payments.refund", `{"amount":5}`, "")
	require.Equal(t, 409, rr.Status, rr.Raw)
	assert.Equal(t, "approval_rejected", rr.Code())
	assert.Equal(t, "not this one", rr.Body["error"].(map[string]any)["details"].(map[string]any)["approval"].(map[string]any)["note"])
	b.clean()

	// A reader sees the ask but not its input, and may not answer: the
	// server's 403 shows in the view, not as a login prompt.
	rb := loginTab(t, browser, f.l.URL, f.reader, fmt.Sprintf("#approvals/%d", ask3))
	rb.wait(`document.querySelector('#approval-tool') && document.querySelector('#policy-json')`)
	assert.Contains(t, rb.str(`document.querySelector('#approval-detail').textContent`), "Shown to approver and admin tokens only.")
	assert.Equal(t, 0, rb.num(`document.querySelectorAll('#approval-input').length`))
	rb.answerAsk("approve", "")
	rb.wait(`!document.querySelector('#approval-error').hidden`)
	assert.Contains(t, rb.str(`document.querySelector('#approval-error').textContent`), "forbidden: ")
	assert.Equal(t, 1, rb.num(`document.querySelector('#login').hidden ? 1 : 0`))
	assert.Equal(t, 0, rb.num(`document.querySelector('#approval-form').hidden ? 1 : 0`), "still pending")
	rb.clean()

	// The admin that asked may not approve its own ask.
	ab := loginTab(t, browser, f.l.URL, f.admin, fmt.Sprintf("#approvals/%d", ask3))
	ab.wait(`document.querySelector('#approval-input')`)
	ab.answerAsk("approve", "mine")
	ab.wait(`!document.querySelector('#approval-error').hidden`)
	assert.Contains(t, ab.str(`document.querySelector('#approval-error').textContent`), "self_approval: ")
	assert.Contains(t, ab.str(`document.querySelector('#approval-error').textContent`), "another person must answer it")
	assert.Equal(t, "pending", f.l.Do("GET", fmt.Sprintf("/v1/approvals/%d", ask3), "", f.as(f.reader)...).Body["state"])
	ab.clean()

	// Answered meanwhile by someone else: 409, and the view shows the answer.
	b.openAsk(ask3)
	b.wait(`!document.querySelector('#approval-form').hidden`)
	other := f.answer(f.alice, ask3, "reject", "answered elsewhere")
	require.Equal(t, 201, other.Status, other.Raw)
	b.answerAsk("approve", "too late")
	b.wait(`!document.querySelector('#approval-error').hidden && document.querySelector('#approval-answer')`)
	assert.Contains(t, b.str(`document.querySelector('#approval-error').textContent`), "already_answered: ")
	assert.Contains(t, b.str(`document.querySelector('#approval-answer').textContent`), "answered elsewhere")
	assert.Equal(t, 1, b.num(`document.querySelector('#approval-form').hidden ? 1 : 0`))
	assert.Equal(t, 0, b.num(`document.querySelectorAll('#approvals-table tbody tr.row').length`))
	b.clean()

	// Expired before the answer: 410; past the retention the input is gone.
	a4 := f.reserve(f.agent, "pay-key-0004", "exec-4", "payments.charge", `{"amount":7}`, "")
	require.Equal(t, 202, a4.Status, a4.Raw)
	ask4 := num(t, a4.Body, "approval", "seq")
	b.do(chromedp.Click(chromedp.CSS("#refresh")))
	b.wait(`document.querySelectorAll('#approvals-table tbody tr.row').length === 1`)
	b.openAsk(ask4)
	b.wait(`document.querySelector('#approval-input')`)
	clock.advance(2 * time.Hour)
	b.answerAsk("approve", "")
	b.wait(`!document.querySelector('#approval-error').hidden`)
	assert.Contains(t, b.str(`document.querySelector('#approval-error').textContent`), "approval_expired: ")
	b.wait(`document.querySelector('#approval-detail .key-head .badge').textContent === 'expired'`)
	assert.Equal(t, 1, b.num(`document.querySelector('#approval-form').hidden ? 1 : 0`))
	clock.advance(8 * 24 * time.Hour)
	b.do(chromedp.Click(chromedp.CSS("#refresh")))
	b.wait(`document.querySelector('#approval-input-box') && !document.querySelector('#approval-input')`)
	assert.Contains(t, b.str(`document.querySelector('#approval-input-box').textContent`), "input deleted")
	assert.Equal(t, 1, b.num(`document.querySelector('#approval-error').hidden ? 1 : 0`), "a refresh clears the refusal")
	b.clean()
}

// askActor is the actor the ledger recorded for the ask at seq.
func askActor(t *testing.T, f *gateFixture, seq int64) string {
	t.Helper()
	r := f.l.Do("GET", fmt.Sprintf("/v1/approvals/%d", seq), "", f.as(f.reader)...)
	require.Equal(t, 200, r.Status, r.Raw)
	return r.Body["actor"].(string)
}
