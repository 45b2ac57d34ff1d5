package test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
)

var uiScreenshot = flag.String("ui-screenshot", "", "write the web page's screenshot to this `file` (docs/auditing.md shows ../docs/ui.png)")

// maxScreenshot bounds the committed screenshot's size.
const maxScreenshot = 300 << 10

// hostileKey is a valid idempotency key (visible ASCII, no space) that is
// also HTML which would run a script if the page parsed it.
const hostileKey = `<img/src/onerror=alert(1)>`

// hostileText is the same attack with spaces, where a field allows them.
const hostileText = `<img src=x onerror=alert(1)>`

// chromium returns the path of a Chromium from Debian packages. In CI
// (CI set, as .ci/run does) a missing browser fails the test; elsewhere
// it skips.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium is not installed, and CI must run the web page test: apt-get install -y chromium (.ci/run does)")
	}
	t.Skip("chromium is not installed (apt-get install -y chromium); CI runs this test")
	return ""
}

// tab is one browser tab driven by the test. It records console errors,
// uncaught exceptions and JavaScript dialogs (an alert would be an XSS).
type tab struct {
	t   *testing.T
	ctx context.Context

	mu       sync.Mutex
	problems []string
	marks    int // flush markers the console reader has seen
}

// flushMarker prefixes the console messages clean logs to know that the
// console reader has caught up.
const flushMarker = "ledger-test-flush "

// newBrowser starts a headless Chromium for the test.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.NoSandbox, // tests run as root in CI
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("lang", "en-US"),
		chromedp.WindowSize(1360, 960),
	)
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	bctx, cancelB := chromedp.NewContext(actx)
	t.Cleanup(cancelB)
	require.NoError(t, chromedp.Do(bctx), "start chromium")
	return bctx
}

// newTab opens a tab of browser.
func newTab(t *testing.T, browser context.Context) *tab {
	t.Helper()
	ctx, cancel := chromedp.NewContext(browser)
	t.Cleanup(cancel)
	require.NoError(t, chromedp.Do(ctx, chromedp.EmulateViewport(1360, 960)))
	tb := &tab{t: t, ctx: ctx}
	messages := chromedp.Console(ctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleDebug && strings.HasPrefix(m.Text, flushMarker) {
				tb.mu.Lock()
				tb.marks++
				tb.mu.Unlock()
				continue
			}
			// A 401 or 404 the page asked for is logged by the browser's
			// network layer; it is no fault of the page.
			if m.Type == chromedp.ConsoleException || (m.Type == chromedp.ConsoleError && m.Source != "network") {
				tb.problem("console " + m.String())
			}
		}
	}()
	dialogs := chromedp.Events(ctx, page.JavascriptDialogOpening)
	go func() {
		for ev, err := range dialogs {
			if err != nil {
				return
			}
			tb.problem("a dialog opened: " + ev.Message)
			_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false})
		}
	}()
	return tb
}

func (b *tab) problem(s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.problems = append(b.problems, s)
}

// clean fails the test if the page logged an error or opened a dialog.
func (b *tab) clean() {
	b.t.Helper()
	// The browser sends console messages in order, and a dialog blocks the
	// page until the dialog reader has recorded it: once a marker logged
	// now has been read, so has every problem before it.
	b.mu.Lock()
	want := b.marks + 1
	b.mu.Unlock()
	b.do(chromedp.Evaluate[chromedp.Void]("console.debug(" + js(fmt.Sprintf("%s%d", flushMarker, want)) + ")"))
	require.Eventually(b.t, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.marks >= want
	}, 30*time.Second, 5*time.Millisecond, "the console reader did not see the flush marker")
	b.mu.Lock()
	defer b.mu.Unlock()
	assert.Empty(b.t, b.problems, "the page logged errors or opened dialogs")
}

func (b *tab) do(steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	require.NoError(b.t, chromedp.Do(b.ctx, steps...))
}

// wait polls a JavaScript expression until it is truthy; an expression
// that throws (its element is not there yet) counts as false.
func (b *tab) wait(expr string) {
	b.t.Helper()
	_, err := chromedp.Run(b.ctx, chromedp.Poll[chromedp.Void]("(() => { try { return ("+expr+"); } catch (e) { return false; } })()",
		chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(30*time.Second)))
	if err != nil {
		b.t.Fatalf("waiting for %s: %v\npage text:\n%s", expr, err, b.str("document.body.innerText"))
	}
}

// str evaluates a JavaScript expression that yields a string.
func (b *tab) str(expr string) string {
	b.t.Helper()
	s, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](expr))
	require.NoError(b.t, err, expr)
	return s
}

func (b *tab) num(expr string) int {
	b.t.Helper()
	n, err := chromedp.Run(b.ctx, chromedp.Evaluate[int](expr))
	require.NoError(b.t, err, expr)
	return n
}

// strs evaluates a JavaScript expression that yields a list of strings.
func (b *tab) strs(expr string) []string {
	b.t.Helper()
	l, err := chromedp.Run(b.ctx, chromedp.Evaluate[[]string](expr))
	require.NoError(b.t, err, expr)
	return l
}

// goHash moves the page to a view.
func (b *tab) goHash(h string) {
	b.t.Helper()
	b.do(chromedp.Evaluate[chromedp.Void]("location.hash = " + js(h)))
}

// js quotes s as a JavaScript string literal.
func js(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// texts is a JavaScript expression: the textContent of every match of sel.
func texts(sel string) string {
	return "[...document.querySelectorAll(" + js(sel) + ")].map(e => e.textContent)"
}

// fillForUI records, through the API, the stories the page must show:
// a success and its replay to a new execution, a duplicate effect, a
// runtime retry after a transient failure, a non-retryable failure run
// again under another key, a non-idempotent key interrupted (awaiting a
// person), an operator resolution, and receipts full of hostile strings.
func fillForUI(t *testing.T, l *Ledgerd, clock *testClock, header ...string) {
	t.Helper()
	post := func(path string, body map[string]any, want int) map[string]any {
		t.Helper()
		b, err := json.Marshal(body)
		require.NoError(t, err)
		r := l.Do("POST", path, string(b), header...)
		require.Equal(t, want, r.Status, "%s %s: %s", path, b, r.Raw)
		return r.Body
	}
	reserve := func(key, exec string, attempt int, tool string, idempotent bool, input any, want int) string {
		t.Helper()
		body := map[string]any{"idempotency_key": key, "execution_id": exec, "attempt": attempt, "tool": tool,
			"effect": "write", "idempotent": idempotent, "input": input}
		s, _ := post("/v1/effects/reserve", body, want)["reservation"].(string)
		return s
	}
	commit := func(key, rsv string, body map[string]any) {
		t.Helper()
		body["reservation"] = rsv
		post("/v1/effects/"+url.PathEscape(key)+"/commit", body, 201)
	}
	order := map[string]any{"order": 1234, "amount": 1200}
	commit("refund-order-1234", reserve("refund-order-1234", "exec-1", 1, "payments.refund", true, order, 201),
		map[string]any{"outcome": "succeeded", "external_ref": "re_3Pq9", "result": map[string]any{"amount": 1200, "currency": "eur"}})
	reserve("refund-order-1234", "exec-2", 1, "payments.refund", true, order, 200) // replayed
	commit("refund-order-1234-b", reserve("refund-order-1234-b", "exec-3", 1, "payments.refund", true, order, 201),
		map[string]any{"outcome": "succeeded", "external_ref": "re_8Kx2"})
	mail := map[string]any{"to": "ana@example.com", "template": "welcome"}
	commit("mail-welcome-42", reserve("mail-welcome-42", "exec-4", 1, "email.send", true, mail, 201),
		map[string]any{"outcome": "failed", "error": map[string]any{"code": "TIMEOUT", "message": "smtp timed out", "retryable": true}})
	commit("mail-welcome-42", reserve("mail-welcome-42", "exec-4", 2, "email.send", true, mail, 201),
		map[string]any{"outcome": "succeeded", "external_ref": "msg_77"})
	card := map[string]any{"card": "tok_visa", "amount": 4900}
	commit("charge-card-77", reserve("charge-card-77", "exec-5", 1, "payments.charge", false, card, 201),
		map[string]any{"outcome": "failed", "error": map[string]any{"code": "CARD_DECLINED", "message": "insufficient funds"}})
	commit("charge-card-77-b", reserve("charge-card-77-b", "exec-6", 1, "payments.charge", false, card, 201),
		map[string]any{"outcome": "failed", "error": map[string]any{"code": "CARD_DECLINED", "message": "insufficient funds"}})
	commit(hostileKey, reserve(hostileKey, `"><script>alert(3)</script>`, 1, "notes.write", true, map[string]any{"html": hostileText}, 201),
		map[string]any{"outcome": "succeeded", "external_ref": hostileText, "result": map[string]any{"html": "<script>alert(2)</script>"}})
	for _, key := range []string{"ticket-create-9", "wire-transfer-5"} {
		post("/v1/effects/reserve", map[string]any{"idempotency_key": key, "execution_id": "exec-" + key, "tool": "tickets.create",
			"effect": "external", "lease_ms": 10}, 201)
	}
	clock.advance(20 * time.Millisecond) // both leases end: interrupted
	post("/v1/effects/wire-transfer-5/resolve", map[string]any{"outcome": "failed", "error": map[string]any{"code": "NOT_SENT"},
		"note": "bank portal shows no transfer; " + hostileText}, 201)
}

// TestUI drives the web audit page in a real headless Chromium against the
// real ledgerd binary.
func TestUI(t *testing.T) {
	t.Parallel()
	browser := newBrowser(t)
	clock := newWallClock(t)
	l := clock.start(t, filepath.Join(t.TempDir(), "ledger.db"), "--verify-every", "100ms")
	fillForUI(t, l, clock)
	head := l.Do("GET", "/v1/head", "")
	require.Equal(t, 200, head.Status)
	seq := int(head.Body["seq"].(float64))
	require.Eventually(t, func() bool {
		r := l.Do("GET", "/v1/verification", "")
		return r.Body["ran"] == true && r.Body["receipts"] == float64(seq)
	}, 60*time.Second, 100*time.Millisecond, "the periodic verifier covers the filled ledger")
	audit := l.Do("GET", "/v1/audit", "")
	require.Equal(t, 200, audit.Status, audit.Raw)

	b := newTab(t, browser)
	b.do(chromedp.Navigate(l.URL + "/ui/"))

	t.Run("Overview", func(t *testing.T) {
		b.t = t
		b.wait(`document.querySelector('#head-seq').textContent === ` + js(fmt.Sprint(seq)))
		assert.Equal(t, head.Body["hash"], b.str(`document.querySelector('#head-hash').textContent`))
		b.wait(`document.querySelector('#checkpoint').textContent.includes('No signed checkpoints')`)
		b.wait(`document.querySelector('#verification-status')`)
		assert.Contains(t, b.str(`document.querySelector('#verification-status').textContent`), "No violations")
		assert.Contains(t, b.str(`document.querySelector('#verification').textContent`), fmt.Sprint(seq))
		b.wait(`document.querySelectorAll('#audit-tiles .tile').length > 0`)
		for member, list := range audit.Body {
			n := b.str(`document.querySelector('#audit-tiles [data-member=` + js(member) + `] .n').textContent`)
			assert.Equal(t, fmt.Sprint(len(list.([]any))), n, member)
		}
		assert.Contains(t, b.str(`document.querySelector('#audit-tiles [data-member="interrupted"]').textContent`), "1 awaiting a person")
		assert.Equal(t, "open ledger (no tokens)", b.str(`document.querySelector('#session-state').textContent`))
		if *uiScreenshot != "" {
			saveScreenshot(t, b, *uiScreenshot)
		} else {
			saveScreenshot(t, b, filepath.Join(t.TempDir(), "ui.png"))
		}
	})

	t.Run("Receipts", func(t *testing.T) {
		b.t = t
		b.goHash("#receipts")
		b.wait(`document.querySelectorAll('#receipts-table tbody tr.row').length === ` + fmt.Sprint(seq))
		assert.Equal(t, "1", b.str(`document.querySelector('#receipts-table tbody tr.row td').textContent`))
		assert.True(t, b.num(`document.querySelector('#page-next').disabled ? 1 : 0`) == 1, "one page holds them all")

		// The filter form: one tool.
		b.do(chromedp.SetValue(chromedp.CSS("#f-tool"), "email.send"),
			chromedp.Click(chromedp.CSS("#receipts-form button[type=submit]")))
		b.wait(`location.hash === '#receipts?tool=email.send' && document.querySelectorAll('#receipts-table tbody tr.row').length === 4`)
		assert.Equal(t, []string{"email.send", "email.send", "email.send", "email.send"}, b.strs(texts("#receipts-table tbody tr.row td:nth-child(7)")))
		assert.Equal(t, []string{"reserve", "commit", "reserve", "commit"}, b.strs(texts("#receipts-table tbody tr.row td:nth-child(3)")))

		// Kind and paging through next_after.
		b.goHash("#receipts?kind=commit&limit=2")
		b.wait(`document.querySelectorAll('#receipts-table tbody tr.row').length === 2 && !document.querySelector('#page-next').disabled`)
		first := b.strs(texts("#receipts-table tbody tr.row td:first-child"))
		b.do(chromedp.Click(chromedp.CSS("#page-next")))
		b.wait(`location.hash.includes('after=') && document.querySelector('#receipts-table tbody tr.row td').textContent !== ` + js(first[0]))
		second := b.strs(texts("#receipts-table tbody tr.row td:first-child"))
		require.Len(t, second, 2)
		assert.Greater(t, atoi(t, second[0]), atoi(t, first[1]), "the next page starts after the last seq")
		assert.Equal(t, []string{"commit", "commit"}, b.strs(texts("#receipts-table tbody tr.row td:nth-child(3)")))

		// A row opens the receipt's fields.
		b.goHash("#receipts?key=refund-order-1234")
		b.wait(`document.querySelectorAll('#receipts-table tbody tr.row').length === 3`)
		b.do(chromedp.Click(chromedp.CSS("#receipts-table tbody tr.row:nth-child(2) td:first-child")))
		b.wait(`document.querySelector('#receipts-table tr.detail')`)
		detail := b.str(`document.querySelector('#receipts-table tr.detail').textContent`)
		assert.Contains(t, detail, "re_3Pq9")
		assert.Contains(t, detail, `"currency": "eur"`)
		b.clean()
	})

	t.Run("KeyTimeline", func(t *testing.T) {
		b.t = t
		b.goHash("#key/mail-welcome-42")
		b.wait(`document.querySelectorAll('#timeline li').length === 4`)
		assert.Equal(t, "mail-welcome-42", b.str(`document.querySelector('#key-name').textContent`))
		assert.Equal(t, "succeeded", b.str(`document.querySelector('#key-summary .badge').textContent`))
		assert.Equal(t, []string{"Reserved", "Committedfailed", "Runtime retry after a failureafter TIMEOUT", "Committedsucceeded"},
			b.strs(texts("#timeline li .ev-title")))
		assert.Contains(t, b.str(`document.querySelector('#timeline li:nth-child(2)').textContent`), "smtp timed out")
		assert.Equal(t, []string{"exec-4"}, b.strs(texts("#executions-table tbody td:first-child")))
		assert.Equal(t, "1, 2", b.str(`document.querySelector('#executions-table tbody td:nth-child(3)').textContent`))
		stats := b.str(`document.querySelector('#key-summary .stats').textContent`)
		assert.Contains(t, stats, "1runtime retries")
		assert.Contains(t, stats, "2attempts reserved")

		// Replays and re-invocations; a key reached by clicking its link.
		b.goHash("#receipts?key=refund-order-1234")
		b.wait(`document.querySelectorAll('#receipts-table tbody tr.row').length === 3`)
		b.do(chromedp.Click(chromedp.CSS(`#receipts-table a[data-key="refund-order-1234"]`)))
		b.wait(`location.hash === '#key/refund-order-1234' && document.querySelectorAll('#timeline li').length === 3`)
		assert.Equal(t, "Replayed to a new executiondeduplicated", b.str(`document.querySelector('#timeline li:nth-child(3) .ev-title').textContent`))
		assert.Equal(t, []string{"first", "re-invocation"}, b.strs(texts("#executions-table tbody td:nth-child(2)")))

		// An interrupted key that awaits a person.
		b.goHash("#key/ticket-create-9")
		b.wait(`document.querySelectorAll('#timeline li').length === 2`)
		assert.Equal(t, "interrupted", b.str(`document.querySelector('#key-summary .badge').textContent`))
		assert.Contains(t, b.str(`document.querySelector('#timeline li:nth-child(2)').textContent`), "A person must resolve it")

		b.goHash("#key/no-such-key-1")
		b.wait(`document.querySelector('#key-view').textContent.includes('No receipt has this key.')`)
		b.clean()
	})

	t.Run("Audit", func(t *testing.T) {
		b.t = t
		b.goHash("#audit")
		b.wait(`document.querySelectorAll('#audit article[data-member]').length === ` + fmt.Sprint(len(audit.Body)))
		for member, list := range audit.Body {
			sel := `#audit-` + member
			assert.Equal(t, fmt.Sprint(len(list.([]any))), b.str(`document.querySelector(`+js(sel+` .section-head .badge`)+`).textContent`), member)
			assert.Equal(t, len(list.([]any)), b.num(`document.querySelectorAll(`+js(sel+` tbody tr`)+`).length`), member)
		}
		assert.Equal(t, []string{"refund-order-1234", "refund-order-1234-b"}, b.strs(texts("#audit-duplicate_effects a[data-key]")))
		assert.Equal(t, []string{"ticket-create-9"}, b.strs(texts("#audit-interrupted tr.attention a[data-key]")))
		assert.Contains(t, b.str(`document.querySelector('#audit-runtime_retries tbody').textContent`), "1 → 2")
		assert.Contains(t, b.str(`document.querySelector('#audit-runtime_retries tbody').textContent`), "TIMEOUT")
		assert.Contains(t, b.str(`document.querySelector('#audit-re_invocations tbody').textContent`), "deduped")
		assert.Equal(t, []string{"charge-card-77", "charge-card-77-b", "wire-transfer-5"}, b.strs(texts("#audit-failed a[data-key]")))
		assert.Equal(t, []string{"charge-card-77", "charge-card-77-b"}, b.strs(texts("#audit-repeated_failures a[data-key]")))
		assert.Contains(t, b.str(`document.querySelector('#audit-repeated_failures tbody').textContent`), "CARD_DECLINED")
		assert.Contains(t, b.str(`document.querySelector('#audit-resolutions tbody').textContent`), "bank portal shows no transfer")

		// The audit's own filter.
		b.do(chromedp.SetValue(chromedp.CSS("#a-tool"), "email.send"),
			chromedp.Click(chromedp.CSS("#audit-form button[type=submit]")))
		b.wait(`location.hash === '#audit?tool=email.send' && document.querySelector('#audit-failed .section-head .badge').textContent === '0'`)
		assert.Equal(t, "1", b.str(`document.querySelector('#audit-runtime_retries .section-head .badge').textContent`))
		b.clean()
	})

	t.Run("HostileStringsAreText", func(t *testing.T) {
		b.t = t
		b.goHash("#receipts?key=" + url.QueryEscape(hostileKey))
		b.wait(`document.querySelectorAll('#receipts-table tbody tr.row').length === 2`)
		assert.Equal(t, []string{hostileKey, hostileKey}, b.strs(texts("#receipts-table tbody tr.row td:nth-child(4)")))
		assert.Equal(t, `"><script>alert(3)</script>`, b.str(`document.querySelector('#receipts-table tbody tr.row td:nth-child(5)').textContent`))
		b.do(chromedp.Click(chromedp.CSS("#receipts-table tbody tr.row:nth-child(2) td:first-child")))
		b.wait(`document.querySelector('#receipts-table tr.detail')`)
		assert.Contains(t, b.str(`document.querySelector('#receipts-table tr.detail').textContent`), hostileText)

		b.goHash("#key/" + url.PathEscape(hostileKey))
		b.wait(`document.querySelectorAll('#timeline li').length === 2`)
		assert.Equal(t, hostileKey, b.str(`document.querySelector('#key-name').textContent`))
		body := b.str(`document.querySelector('#key-view').textContent`)
		assert.Contains(t, body, hostileText)
		assert.Contains(t, body, "<script>alert(2)</script>")

		b.goHash("#audit")
		b.wait(`document.querySelector('#audit-resolutions tbody')`)
		assert.Contains(t, b.str(`document.querySelector('#audit-resolutions tbody').textContent`), hostileText)

		// Nothing of it became markup: no element carries an event handler,
		// the page's only script is its own file, its only image the logo.
		assert.Equal(t, 0, b.num(`document.querySelectorAll('[onerror],[onload]').length`))
		assert.Equal(t, []string{l.URL + "/ui/app.js"}, b.strs(`[...document.scripts].map(s => s.src)`))
		assert.Equal(t, []string{l.URL + "/ui/favicon.svg"}, b.strs(`[...document.images].map(i => i.src)`))
		b.clean()
	})

	t.Run("Namespaces", func(t *testing.T) {
		b.t = t
		// Only default: no selector.
		b.goHash("#overview")
		b.wait(`document.querySelector('#head-seq').textContent === ` + js(fmt.Sprint(seq)))
		assert.Equal(t, 1, b.num(`document.querySelector('#ns-picker').hidden ? 1 : 0`))

		r := l.Do("POST", "/v1/namespaces", `{"name":"payments"}`)
		require.Equal(t, 201, r.Status, r.Raw)
		r = l.Do("POST", "/v1/ns/payments/effects/reserve", `{"idempotency_key":"refund-order-1234","execution_id":"exec-p","tool":"payments.refund","effect":"write"}`)
		require.Equal(t, 201, r.Status, r.Raw)
		b.do(chromedp.Click(chromedp.CSS("#refresh")))
		b.wait(`!document.querySelector('#ns-picker').hidden`)
		assert.Equal(t, []string{"default", "payments"}, b.strs(`[...document.querySelectorAll('#namespace option')].map(o => o.value)`))
		assert.Equal(t, "default", b.str(`document.querySelector('#namespace').value`))
		assert.Equal(t, "payments (1 receipt)", b.str(`document.querySelector('#namespace option[value="payments"]').textContent`))

		// payments: its own chain of one receipt, its own key.
		choose := func(ns string) {
			b.do(chromedp.Evaluate[chromedp.Void](`(() => { const s = document.querySelector('#namespace'); s.value = ` + js(ns) + `; s.dispatchEvent(new Event('change')); })()`))
		}
		choose("payments")
		b.wait(`document.querySelector('#head-seq').textContent === '1'`)
		assert.Equal(t, r.Body["receipt"].(map[string]any)["hash"], b.str(`document.querySelector('#head-hash').textContent`))
		b.wait(`document.querySelector('#checkpoint').textContent.includes('/log/payments/checkpoint')`)
		b.goHash("#receipts")
		b.wait(`document.querySelectorAll('#receipts-table tbody tr.row').length === 1`)
		assert.Equal(t, []string{"exec-p"}, b.strs(texts("#receipts-table tbody tr.row td:nth-child(5)")))
		b.goHash("#key/refund-order-1234")
		b.wait(`document.querySelector('#key-view').textContent.includes('exec-p')`)
		assert.NotContains(t, b.str(`document.querySelector('#key-view').textContent`), "exec-1")
		assert.Equal(t, "payments", b.str(`document.querySelector('#namespace').value`), "the choice holds across views")

		// Back to default: the same key is default's own, with its history.
		choose("default")
		b.wait(`document.querySelector('#key-view').textContent.includes('exec-1') && !document.querySelector('#key-view').textContent.includes('exec-p')`)
		b.goHash("#overview")
		b.wait(`document.querySelector('#head-seq').textContent === ` + js(fmt.Sprint(seq)))
		b.clean()
	})
}

// TestUI_violations: the page shows what the periodic verifier found in a
// tampered ledger, and warns that its audit is not to be trusted.
func TestUI_violations(t *testing.T) {
	t.Parallel()
	browser := newBrowser(t)
	db := filepath.Join(t.TempDir(), "ledger.db")
	clock := newWallClock(t)
	l := clock.start(t, db, "--default-payloads", "inline") // external_ref is edited in the chain below
	fillForUI(t, l, clock)
	require.NoError(t, l.Stop())
	sdb, err := sql.Open("sqlite3", db)
	require.NoError(t, err)
	_, err = sdb.Exec(`DROP TRIGGER ns_receipts_no_update; UPDATE ns_receipts SET external_ref = ? WHERE ns = 0 AND seq = 2`, hostileText)
	require.NoError(t, err)
	require.NoError(t, sdb.Close())
	l = StartLedgerd(t, db, "--verify-every", "1h")

	b := newTab(t, browser)
	b.do(chromedp.Navigate(l.URL + "/ui/"))
	b.wait(`document.querySelector('#verification-status').textContent.includes('violation')`)
	assert.Contains(t, b.str(`document.querySelector('#verification-status').textContent`), "1 violation")
	b.wait(`!document.querySelector('#card-violations').hidden`)
	assert.Equal(t, 0, b.num(`document.querySelectorAll('#card-violations p:not([hidden])').length`), "no 'and N more' for one")
	assert.Equal(t, []string{"2"}, b.strs(texts("#violations-table tbody td:first-child")))
	assert.Equal(t, []string{"hash_mismatch"}, b.strs(texts("#violations-table tbody td:nth-child(2)")))
	b.wait(`document.querySelector('#audit-warning #audit-violations')`)
	assert.Contains(t, b.str(`document.querySelector('#audit-violations').textContent`), "1 integrity violation")

	b.goHash("#audit")
	b.wait(`document.querySelector('#audit #audit-violations')`)
	b.goHash("#receipts?key=refund-order-1234")
	b.wait(`document.querySelectorAll('#receipts-table tbody tr.row').length === 3`)
	b.do(chromedp.Click(chromedp.CSS("#receipts-table tbody tr.row:nth-child(2) td:first-child")))
	b.wait(`document.querySelector('#receipts-table tr.detail')`)
	assert.Contains(t, b.str(`document.querySelector('#receipts-table tr.detail').textContent`), hostileText, "the forged value, as text")
	assert.Equal(t, 0, b.num(`document.querySelectorAll('[onerror],[onload]').length`))
	b.clean()
}

// saveScreenshot writes a PNG of the tab's viewport to path and checks it
// stays small enough to commit.
func saveScreenshot(t *testing.T, b *tab, path string) {
	t.Helper()
	// The whole page and no more: the viewport takes the page's height
	// (down to its footer) for the shot.
	h := b.num(`Math.ceil(document.querySelector('footer').getBoundingClientRect().bottom + window.scrollY)`)
	b.do(chromedp.EmulateViewport(1360, int64(max(h, 400))))
	png, err := chromedp.Run(b.ctx, chromedp.CaptureScreenshot())
	require.NoError(t, err)
	b.do(chromedp.EmulateViewport(1360, 960))
	require.True(t, bytes.HasPrefix(png, []byte("\x89PNG")), "a PNG")
	assert.Less(t, len(png), maxScreenshot, "the screenshot stays under 300 KB")
	require.NoError(t, os.WriteFile(path, png, 0o644))
	t.Logf("screenshot: %s (%d bytes)", path, len(png))
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	var n int
	_, err := fmt.Sscan(s, &n)
	require.NoError(t, err, s)
	return n
}

// TestUI_token: with tokens, the page's files load without one, the page
// asks for a token, says why one is refused, keeps a good one in session
// storage and sends it on every API call.
func TestUI_token(t *testing.T) {
	t.Parallel()
	browser := newBrowser(t)
	clock := newWallClock(t)
	l := clock.start(t, filepath.Join(t.TempDir(), "ledger.db"))
	toks, err := sqlite.OpenTokens(context.Background(), l.DB)
	require.NoError(t, err)
	defer toks.Close()
	reader, err := toks.Create(context.Background(), "auditor", ledger.RoleReader)
	require.NoError(t, err)
	writer, err := toks.Create(context.Background(), "gateway", ledger.RoleWriter)
	require.NoError(t, err)
	admin, err := toks.Create(context.Background(), "ops", ledger.RoleAdmin)
	require.NoError(t, err)
	clock.advance(time.Second) // past the token-existence re-read
	require.Eventually(t, func() bool { return l.Do("GET", "/v1/head", "").Status == 401 }, 60*time.Second, 5*time.Millisecond)
	fillForUI(t, l, clock, "Authorization", "Bearer "+admin)
	seq := fmt.Sprint(int(l.Do("GET", "/v1/head", "", "Authorization", "Bearer "+reader).Body["seq"].(float64)))

	b := newTab(t, browser)
	b.do(chromedp.Navigate(l.URL + "/ui/"))
	b.wait(`!document.querySelector('#login').hidden`)
	assert.True(t, b.num(`document.querySelector('#main').hidden ? 1 : 0`) == 1, "no data view without a token")
	assert.Equal(t, "", b.str(`document.querySelector('#session-state').textContent`))
	assert.Contains(t, b.str(`document.querySelector('#login-message').textContent`), "requires a bearer token")

	login := func(token string) {
		b.do(chromedp.SetValue(chromedp.CSS("#token"), token),
			chromedp.Click(chromedp.CSS("#login-form button[type=submit]")))
	}
	login("elt_not-a-real-token")
	b.wait(`document.querySelector('#login-message').textContent.includes('refused')`)
	assert.Contains(t, b.str(`document.querySelector('#login-message').textContent`), "invalid or revoked")

	login(writer)
	b.wait(`document.querySelector('#login-message').textContent.includes('may not read')`)
	assert.Contains(t, b.str(`document.querySelector('#login-message').textContent`), "(writer)")

	login(reader)
	b.wait(`document.querySelector('#login').hidden && document.querySelector('#head-seq').textContent === ` + js(seq))
	assert.Equal(t, reader, b.str(`sessionStorage.getItem('effect-ledger.token')`))
	b.wait(`document.querySelectorAll('#audit-tiles .tile').length > 0`)
	assert.Equal(t, "token in use", b.str(`document.querySelector('#session-state').textContent`))

	// Every view reads with the token; a reload keeps it.
	b.goHash("#key/" + url.PathEscape(hostileKey))
	b.wait(`document.querySelectorAll('#timeline li').length === 2`)
	assert.Contains(t, b.str(`document.querySelector('#timeline').textContent`), "ops", "the token's name is the actor")
	b.do(chromedp.Reload())
	b.wait(`document.querySelectorAll('#timeline li').length === 2`)
	assert.Equal(t, hostileKey, b.str(`document.querySelector('#key-name').textContent`))

	// A revoked token sends the page back to the prompt.
	require.NoError(t, toks.Revoke(context.Background(), "auditor"))
	b.do(chromedp.Click(chromedp.CSS("#refresh")))
	b.wait(`!document.querySelector('#login').hidden && document.querySelector('#login-message').textContent.includes('refused')`)

	b.do(chromedp.Click(chromedp.CSS("#forget")))
	b.wait(`!document.querySelector('#login').hidden && document.querySelector('#login-message').textContent.includes('requires a bearer token')`)
	assert.Equal(t, "", b.str(`sessionStorage.getItem('effect-ledger.token') || ''`))
	b.clean()
	assert.True(t, strings.HasPrefix(reader, ledger.TokenPrefix))
}

// TestUI_keyLifetime: the web page shows when a finalized key expires,
// marks the reserve that renewed an expired key, and lists renewed keys
// in the audit.
func TestUI_keyLifetime(t *testing.T) {
	t.Parallel()
	browser := newBrowser(t)
	clock := newTestClock(t, t0)
	l := clock.start(t, filepath.Join(t.TempDir(), "ledger.db"), "--default-key-ttl", "1h")
	for _, key := range []string{"daily-report", "kept-report"} {
		tok := l.Reserve(t, ttlReserve(key, "exec-1", false, ""))
		l.Commit(t, key, `{"reservation":"`+tok+`","outcome":"succeeded"}`)
	}
	clock.set(t0 + hourMS)
	r := l.Do("POST", "/v1/effects/reserve", ttlReserve("daily-report", "exec-2", false, ""))
	require.Equal(t, 201, r.Status, r.Raw)

	b := newTab(t, browser)
	b.do(chromedp.Navigate(l.URL + "/ui/"))
	b.goHash("#key/kept-report")
	b.wait(`document.querySelector('#key-expires')`)
	assert.Contains(t, b.str(`document.querySelector('#key-expires').textContent`), "2025-11-30 05:00:00 UTC")

	b.goHash("#key/daily-report")
	b.wait(`document.querySelector('#key-name') && document.querySelector('#key-name').textContent === 'daily-report' && document.querySelectorAll('#timeline li').length === 2`)
	assert.Equal(t, "Reserved again after the key expirednew generation", b.str(`document.querySelector('#timeline li .ev-title').textContent`))
	assert.Equal(t, 0, b.num(`document.querySelectorAll('#key-expires').length`), "a reserved key does not expire")

	b.goHash("#audit")
	b.wait(`document.querySelector('#audit-renewed_keys')`)
	assert.Contains(t, b.str(`document.querySelector('#audit-renewed_keys').textContent`), "daily-report")
}

// TestUI_resultFromResultText: the web page shows a receipt's result from
// result_text (SPEC §9.1), numbers as recorded; JSON.parse of result
// would show 9007199254740992 for the 9007199254740993 recorded.
func TestUI_resultFromResultText(t *testing.T) {
	t.Parallel()
	browser := newBrowser(t)
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"))
	tok := l.Reserve(t, `{"idempotency_key":"portable-ui-0001","execution_id":"exec-1","tool":"payments.refund","effect":"write"}`)
	l.Commit(t, "portable-ui-0001", `{"reservation":"`+tok+`","outcome":"succeeded","result":`+portableBig+`}`)

	b := newTab(t, browser)
	b.do(chromedp.Navigate(l.URL + "/ui/"))
	b.goHash("#receipts?key=portable-ui-0001")
	b.wait(`document.querySelectorAll('#receipts-table tbody tr.row').length === 2`)
	b.do(chromedp.Click(chromedp.CSS("#receipts-table tbody tr.row:nth-child(2) td:first-child")))
	b.wait(`document.querySelector('#receipts-table tr.detail')`)
	detail := b.str(`document.querySelector('#receipts-table tr.detail pre').textContent`)
	assert.Equal(t, "{\n  \"id\": 9007199254740993,\n  \"big\": 123456789012345678901234567890,\n  \"ok\": true\n}", detail)

	b.goHash("#key/portable-ui-0001")
	b.wait(`document.querySelectorAll('#timeline li').length === 2`)
	body := b.str(`document.querySelector('#key-view').textContent`)
	assert.Contains(t, body, `"id": 9007199254740993`)
	assert.NotContains(t, body, "9007199254740992")
	b.clean()
}

// TestUI_erased: in a committed namespace (contract §14) the web page shows
// a receipt's values, and once they are erased says which erase receipt
// took them, with no trace of the value.
func TestUI_erased(t *testing.T) {
	t.Parallel()
	browser := newBrowser(t)
	marker := randomMarker(t)
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"))
	tok := l.Reserve(t, `{"idempotency_key":"mail-ui-0001","execution_id":"exec-1","tool":"email.send","effect":"external"}`)
	l.Commit(t, "mail-ui-0001", `{"reservation":"`+tok+`","outcome":"succeeded","external_ref":"msg-`+marker+`","result":{"to":"`+marker+`"}}`)

	b := newTab(t, browser)
	b.do(chromedp.Navigate(l.URL + "/ui/"))
	b.goHash("#key/mail-ui-0001")
	b.wait(`document.querySelectorAll('#timeline li').length === 2`)
	assert.Contains(t, b.str(`document.querySelector('#key-view').textContent`), "msg-"+marker, "the value, not its commitment")

	er := l.Do("POST", "/v1/erasures", `{"keys":["mail-ui-0001"],"reason":"request 4"}`)
	require.Equal(t, 201, er.Status, er.Raw)
	b.do(chromedp.Navigate(l.URL + "/ui/"))
	b.goHash("#key/mail-ui-0001")
	b.wait(`document.querySelectorAll('#timeline li').length === 2`)
	body := b.str(`document.querySelector('#key-view').textContent`)
	assert.Contains(t, body, "erased by receipt 3")
	assert.NotContains(t, body, marker)
	b.goHash("#receipts?key=mail-ui-0001")
	b.wait(`document.querySelectorAll('#receipts-table tbody tr.row').length === 2`)
	b.do(chromedp.Click(chromedp.CSS("#receipts-table tbody tr.row:nth-child(2) td:first-child")))
	b.wait(`document.querySelector('#receipts-table tr.detail')`)
	detail := b.str(`document.querySelector('#receipts-table tr.detail').textContent`)
	assert.Contains(t, detail, "erased by receipt 3")
	assert.NotContains(t, detail, marker)
	b.clean()
}
