package test

import (
	"path/filepath"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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
