package api

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"path"
	"time"

	"github.com/gorilla/mux"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// The web audit page: plain HTML, CSS and JavaScript, embedded in the
// binary, with no build step and nothing loaded from elsewhere. The files
// hold no ledger data; the page reads the API with the reader token the
// user gives it.
//
//go:embed ui
var uiFiles embed.FS

// UICSP is the Content-Security-Policy of the web page: its own script and
// style files only (no inline script or style), API calls to its own
// origin, no framing, and Trusted Types enforced so that no string can
// ever be parsed as HTML by the page.
const UICSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'; " +
	"require-trusted-types-for 'script'; trusted-types 'none'"

// uiFile is one embedded file, ready to serve.
type uiFile struct {
	body        []byte
	contentType string
	etag        string
}

// uiContentTypes are the types of the files the page is made of.
var uiContentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".svg":  "image/svg+xml",
}

// ui maps a file name under /ui/ to its content.
var ui = func() map[string]uiFile {
	m := map[string]uiFile{}
	err := fs.WalkDir(uiFiles, "ui", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		ct, ok := uiContentTypes[path.Ext(p)]
		if !ok {
			return nil
		}
		b, err := uiFiles.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		m[p[len("ui/"):]] = uiFile{body: b, contentType: ct, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		return nil
	})
	if err != nil {
		panic("api: embedded ui: " + err.Error()) // the embed is fixed at build time
	}
	m[""] = m["index.html"]
	return m
}()

// handleUI serves the page's static files with security headers; an ETag
// lets the browser revalidate them cheaply.
func (s *Server) handleUI(w http.ResponseWriter, r *http.Request) {
	f, ok := ui[mux.Vars(r)["file"]]
	if !ok {
		s.Error(w, r, ledger.Errorf(ledger.ECodeNotFound, "no such file: %s", truncate(r.URL.Path, 200)))
		return
	}
	h := w.Header()
	h.Set("Content-Type", f.contentType)
	h.Set("Content-Security-Policy", UICSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cache-Control", "no-cache")
	h.Set("ETag", f.etag)
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(f.body))
}
