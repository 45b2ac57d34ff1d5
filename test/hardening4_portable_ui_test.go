package test

import (
	"path/filepath"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
)

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
