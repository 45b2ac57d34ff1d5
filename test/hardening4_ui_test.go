package test

import (
	"context"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/mcpgate"
)

// choose sets a select's value as a person would, with its change event.
func (b *tab) choose(sel, value string) {
	b.t.Helper()
	b.do(chromedp.Evaluate[chromedp.Void]("(() => { const s = document.querySelector(" + js(sel) + "); s.value = " + js(value) +
		"; s.dispatchEvent(new Event('change')); })()"))
}

// resolveForm fills the key view's resolve form (fields left "" stay
// as they are) and submits it.
func (b *tab) resolveForm(outcome, ref, code, note string) {
	b.t.Helper()
	b.wait(`!document.querySelector('#resolve-card').hidden`)
	b.choose("#r-outcome", outcome)
	for sel, v := range map[string]string{"#r-ref": ref, "#r-code": code, "#r-note": note} {
		if v != "" { // chromedp's SetValue cannot set ""
			b.do(chromedp.SetValue(chromedp.CSS(sel), v))
		}
	}
	b.do(chromedp.Click(chromedp.CSS("#resolve-submit")))
}

// TestUI_resolve: the page the model's unsafe_resume and
// retry_not_allowed answers name (ledger-mcp's --admin-listen /ui/)
// resolves keys, in a real headless Chromium. An interrupted call's key
// shows a resolve form; a reader token's attempt is refused (forbidden)
// and a form without a note (invalid_request), both shown under the form;
// the admin token resolves it as succeeded with an external reference,
// the API then shows the key resolved, and the model's next identical
// call is a replay. A failed key (on_error failed) is corrected to
// not_applied on the page, and the same call runs again. On SQLite and
// PostgreSQL.
func TestUI_resolve(t *testing.T) {
	t.Parallel()
	browser := newBrowser(t)
	onSQLiteAndPostgres(t, func(t *testing.T, db string) {
		testUIResolve(t, browser, db)
	})
}

func testUIResolve(t *testing.T, browser context.Context, db string) {
	sh := newShop(t)
	policy := writePolicy(t, `[{"tool": "observe", "effect": "write", "on_error": "failed"}]`)
	g := startAdminGateway(t, sh, db, "--policy", policy, "--lease", "300ms", "--wait", "0s")
	admin := g.token(t)
	key := g.interrupt(t, sh, "u1")
	reader := createToken(t, db, "reader-bob", "reader")
	refused := g.call(t, "slow", map[string]any{"id": "u1"}, nil)
	require.Equal(t, "unsafe_resume", status(refused))
	assert.Contains(t, text(t, refused), g.url+"/ui/", "the model sends a person to the page")

	// A reader sees the form, and the server's refusal.
	rb := loginTab(t, browser, g.url, reader, "#key/"+key)
	rb.wait(`document.querySelector('#key-name') && !document.querySelector('#resolve-card').hidden`)
	assert.Equal(t, "Resolve this interrupted key", rb.str(`document.querySelector('#resolve-title').textContent`))
	rb.resolveForm("succeeded", "", "", "I checked")
	rb.wait(`!document.querySelector('#resolve-error').hidden`)
	assert.Contains(t, rb.str(`document.querySelector('#resolve-error').textContent`), "forbidden: ")
	assert.Contains(t, rb.str(`document.querySelector('#resolve-error').textContent`), "needs an admin token")
	assert.Equal(t, 1, rb.num(`document.querySelector('#login').hidden ? 1 : 0`), "a refusal, not the token prompt")
	rb.clean()

	// The admin token: the outcome's fields, a refusal without a note,
	// then the resolution.
	b := loginTab(t, browser, g.url, admin, "#key/"+key)
	b.wait(`document.querySelector('#key-name') && !document.querySelector('#resolve-card').hidden`)
	assert.Equal(t, "interrupted", b.str(`document.querySelector('#key-summary .key-head .badge').textContent`))
	assert.Contains(t, b.str(`document.querySelector('#timeline').textContent`), "with the form below")
	b.choose("#r-outcome", "not_applied")
	assert.Equal(t, 1, b.num(`document.querySelector('#r-ref-field').hidden && !document.querySelector('#r-error-fields').hidden ? 1 : 0`))
	b.resolveForm("succeeded", "shop-log-77", "", "")
	assert.Equal(t, 1, b.num(`!document.querySelector('#r-ref-field').hidden && document.querySelector('#r-error-fields').hidden ? 1 : 0`))
	b.wait(`!document.querySelector('#resolve-error').hidden`)
	assert.Contains(t, b.str(`document.querySelector('#resolve-error').textContent`), "invalid_request: ")
	assert.Contains(t, b.str(`document.querySelector('#resolve-error').textContent`), "note")
	code, view := getAuthJSON(t, g.url+"/v1/effects/"+key, admin)
	require.Equal(t, 200, code, view)
	assert.Equal(t, "interrupted", view["state"], "nothing recorded yet")
	b.resolveForm("succeeded", "", "", "the shop's log shows run 1 finished")
	b.wait(`document.querySelector('#resolve-card').hidden && document.querySelector('#key-summary .key-head .badge').textContent === 'succeeded'`)
	assert.Contains(t, b.str(`document.querySelector('#timeline').textContent`), "Resolved by an operator")
	assert.Contains(t, b.str(`document.querySelector('#timeline').textContent`), "the shop's log shows run 1 finished")
	b.clean()

	// The API shows the key resolved, by the admin token, as the form said.
	code, view = getAuthJSON(t, g.url+"/v1/effects/"+key, admin)
	require.Equal(t, 200, code, view)
	assert.Equal(t, "succeeded", view["state"])
	rs := view["receipts"].([]any)
	last := rs[len(rs)-1].(map[string]any)
	assert.Equal(t, "resolve", last["kind"])
	assert.Equal(t, "succeeded", last["outcome"])
	assert.Equal(t, "shop-log-77", last["external_ref"])
	assert.Equal(t, "the shop's log shows run 1 finished", last["note"])
	assert.Equal(t, "ledger-mcp-admin", last["actor"])
	replay := g.call(t, "slow", map[string]any{"id": "u1"}, nil)
	assert.Equal(t, true, replay.Meta[mcpgate.MetaReplayed], text(t, replay))
	assert.Equal(t, 1, sh.runs("slow", "u1"))

	// A failed key, corrected to not_applied on the page.
	fail := g.call(t, "observe", map[string]any{"id": "bob"}, nil)
	require.True(t, fail.IsError)
	stuck := g.call(t, "observe", map[string]any{"id": "bob"}, nil)
	require.Equal(t, "retry_not_allowed", status(stuck), text(t, stuck))
	assert.Contains(t, text(t, stuck), g.url+"/ui/")
	failedKey, _ := stuck.Meta[mcpgate.MetaKey].(string)
	b.goHash("#key/" + failedKey)
	b.wait(`document.querySelector('#key-name') && document.querySelector('#key-name').textContent === ` + js(failedKey) +
		` && !document.querySelector('#resolve-card').hidden`)
	assert.Equal(t, "Mark this failure as not applied", b.str(`document.querySelector('#resolve-title').textContent`))
	assert.Equal(t, []string{"succeeded", "failed"}, b.strs(`[...document.querySelectorAll('#r-outcome option')].filter(o => o.disabled).map(o => o.value)`))
	b.resolveForm("not_applied", "", "CHECKED_NOTHING_APPLIED", "bob does not exist: nothing was written")
	b.wait(`document.querySelector('#resolve-card').hidden && document.querySelector('#key-summary .key-head .badge').textContent === 'not_applied'`)
	b.clean()
	code, view = getAuthJSON(t, g.url+"/v1/effects/"+failedKey, admin)
	require.Equal(t, 200, code, view)
	assert.Equal(t, "not_applied", view["state"])
	again := g.call(t, "observe", map[string]any{"id": "bob"}, nil)
	assert.Contains(t, text(t, again), "not found (run 2)", "marked not applied, the same call runs again")
	g.stop(t)
	verified(t, db)
}
