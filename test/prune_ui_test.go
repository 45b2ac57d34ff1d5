package test

import (
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestUI_pruned: on a namespace pruned through 601 (SPEC §16) GET
// /v1/namespaces lists pruned_through, the web page's namespace picker
// and overview show it, and a pruned key or ask opened shows "pruned by
// #603 (segment reports-1-601)" instead of an error.
func TestUI_pruned(t *testing.T) {
	t.Parallel()
	browser := newBrowser(t)
	p := buildPrunedSQLite(t)
	l := StartLedgerd(t, p.path)

	r := l.Do("GET", "/v1/namespaces", "")
	require.Equal(t, 200, r.Status, r.Raw)
	through := map[string]any{}
	for _, n := range r.Body["namespaces"].([]any) {
		n := n.(map[string]any)
		through[n["name"].(string)] = n["pruned_through"]
	}
	assert.Equal(t, map[string]any{"default": float64(0), "reports": float64(601)}, through)

	b := newTab(t, browser)
	b.do(chromedp.Navigate(l.URL + "/ui/"))
	b.wait(`!document.querySelector('#ns-picker').hidden`)
	assert.Equal(t, "reports (606 receipts, 1–601 pruned)", b.str(`document.querySelector('#namespace option[value="reports"]').textContent`))
	b.do(chromedp.Evaluate[chromedp.Void](`(() => { const s = document.querySelector('#namespace'); s.value = 'reports'; s.dispatchEvent(new Event('change')); })()`))
	b.wait(`document.querySelector('#head-seq').textContent === '606'`)
	b.wait(`!document.querySelector('#head-pruned').hidden`)
	assert.Contains(t, b.str(`document.querySelector('#head-pruned').textContent`), "pruned through #601 by #603")

	b.goHash("#key/prune-008") // pruned whole
	b.wait(`document.querySelector('#key-pruned')`)
	assert.Equal(t, "Its receipts were pruned by #603 (segment reports-1-601).", b.str(`document.querySelector('#key-pruned').textContent`))
	assert.True(t, b.str(`document.querySelector('#banner').hidden ? 'hidden' : 'shown'`) == "hidden", "no error banner")

	b.goHash("#approvals/5") // a pruned seq
	b.wait(`document.querySelector('#approval-pruned')`)
	assert.Equal(t, "Ask #5 was pruned by #603 (segment reports-1-601).", b.str(`document.querySelector('#approval-pruned').textContent`))
	b.clean()
}
