package api_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

// get fetches path without following redirects.
func get(t *testing.T, url string, header ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := c.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res, string(b)
}

func TestServer_UI(t *testing.T) {
	t.Parallel()
	srv, _ := MustOpenServer(t)

	t.Run("OK", func(t *testing.T) {
		for _, tt := range []struct{ path, contentType, contains string }{
			{"/ui/", "text/html; charset=utf-8", `<script src="app.js" defer></script>`},
			{"/ui/index.html", "text/html; charset=utf-8", "<title>"},
			{"/ui/app.js", "text/javascript; charset=utf-8", "'use strict';"},
			{"/ui/style.css", "text/css; charset=utf-8", ":root"},
			{"/ui/favicon.svg", "image/svg+xml", "<svg"},
		} {
			res, body := get(t, srv.URL+tt.path)
			require.Equal(t, 200, res.StatusCode, tt.path)
			assert.Equal(t, tt.contentType, res.Header.Get("Content-Type"), tt.path)
			assert.Contains(t, body, tt.contains, tt.path)
			assert.Equal(t, api.UICSP, res.Header.Get("Content-Security-Policy"), tt.path)
			assert.Equal(t, "nosniff", res.Header.Get("X-Content-Type-Options"), tt.path)
			assert.Equal(t, "DENY", res.Header.Get("X-Frame-Options"), tt.path)
			assert.Equal(t, "no-referrer", res.Header.Get("Referrer-Policy"), tt.path)
			etag := res.Header.Get("ETag")
			require.NotEmpty(t, etag, tt.path)
			res, _ = get(t, srv.URL+tt.path, "If-None-Match", etag)
			assert.Equal(t, http.StatusNotModified, res.StatusCode, tt.path)
		}
		csp := api.UICSP
		for _, d := range []string{"default-src 'none'", "script-src 'self'", "frame-ancestors 'none'", "require-trusted-types-for 'script'"} {
			assert.Contains(t, csp, d)
		}
		assert.NotContains(t, csp, "unsafe-inline")
		assert.NotContains(t, csp, "unsafe-eval")
	})

	t.Run("OKRedirect", func(t *testing.T) {
		res, _ := get(t, srv.URL+"/ui")
		assert.Equal(t, http.StatusMovedPermanently, res.StatusCode)
		assert.Equal(t, "/ui/", res.Header.Get("Location"))
	})

	t.Run("ErrNotFound", func(t *testing.T) {
		for _, p := range []string{"/ui/nope.js", "/ui/../v1/head", "/ui/ui/index.html"} {
			r := do(t, srv, "GET", p, "")
			assert.Equal(t, 404, r.status, p)
			assert.Equal(t, "not_found", r.code(), p)
		}
		r := do(t, srv, "POST", "/ui/", "{}")
		assert.Equal(t, 405, r.status)
	})
}

// TestServer_UIAuth: the page's files are served without a token (they
// hold no data); everything the page reads needs one.
func TestServer_UIAuth(t *testing.T) {
	t.Parallel()
	db := ledgertest.Open(t, ledgertest.WithNow(time.Now))
	path := db.Path()
	_, err := MustOpenTokens(t, path).Create(context.Background(), "auditor", ledger.RoleReader)
	require.NoError(t, err)
	srv := MustServe(t, api.NewServer(db.Ledger, api.Config{Logger: quiet}))
	for _, p := range []string{"/ui/", "/ui/app.js", "/ui/style.css"} {
		res, _ := get(t, srv.URL+p)
		assert.Equal(t, 200, res.StatusCode, p)
	}
	for _, p := range []string{"/v1/audit", "/v1/verification", "/v1/head", "/v1/receipts"} {
		r := do(t, srv, "GET", p, "")
		assert.Equal(t, 401, r.status, p)
		assert.Equal(t, "unauthorized", r.code(), p)
	}
}

// TestUI_files checks the page's sources: no inline script, style or event
// handler (the CSP would block them), nothing loaded from another origin,
// and no HTML sink in the script.
func TestUI_files(t *testing.T) {
	t.Parallel()
	dir := filepath.Join("ui")
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		return string(b)
	}
	html := read("index.html")
	scripts := regexp.MustCompile(`<script[^>]*>`).FindAllString(html, -1)
	require.NotEmpty(t, scripts)
	for _, s := range scripts {
		assert.Regexp(t, `\bsrc="[a-z]+\.js"`, s, "only script files of the page, no inline script")
	}
	assert.NotRegexp(t, `(?i)\son[a-z]+\s*=`, html, "no inline event handlers")
	assert.NotRegexp(t, `(?i)\sstyle\s*=|<style`, html, "no inline style")
	for _, name := range []string{"index.html", "app.js", "style.css", "favicon.svg"} {
		src := read(name)
		assert.NotRegexp(t, `(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/`, strings.ReplaceAll(src, "http://www.w3.org/2000/svg", ""), "%s loads nothing from elsewhere", name)
	}
	js := read("app.js")
	for _, sink := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function", "createContextualFragment"} {
		assert.NotContains(t, js, sink, "no HTML sink in app.js")
	}
	for _, ref := range regexp.MustCompile(`(?:src|href)="([a-z]+\.[a-z]+)"`).FindAllStringSubmatch(html, -1) {
		_, err := os.Stat(filepath.Join(dir, ref[1]))
		assert.NoError(t, err, "index.html refers to %s", ref[1])
	}
}
