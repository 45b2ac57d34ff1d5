package test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"sync"
	"testing"

	"github.com/effect-ledger/effect-ledger/testkit/openapicheck"
)

// Every HTTP request the e2e tests make to a ledgerd started by
// StartLedgerd, through http.DefaultClient (Do, rawPost, http.Post) or
// through checked(…), is validated, with its response, against
// api/openapi.yaml; a mismatch fails the test that started that ledgerd.
// Requests to other servers (the example gateway) pass through.

// watch is what a ledgerd's host reports to.
type watch struct {
	tb      testing.TB
	observe func(op string, x openapicheck.Exchange) // optional
}

// watched maps the host:port of every running ledgerd to its watch.
var watched sync.Map

// installOpenAPICheck loads the document and makes http.DefaultTransport
// check every exchange with a ledgerd. Called from TestMain.
func installOpenAPICheck() error {
	doc, err := openapicheck.Load()
	if err != nil {
		return err
	}
	openAPIDoc = doc
	http.DefaultTransport = checked(http.DefaultTransport)
	return nil
}

// openAPIDoc is the loaded document.
var openAPIDoc *openapicheck.Doc

// checked wraps a transport so that every exchange it carries with a
// ledgerd is checked against the OpenAPI document.
func checked(base http.RoundTripper) http.RoundTripper {
	return &openapicheck.Transport{Base: base, Doc: openAPIDoc, Report: reportMismatch, Observe: observe,
		Serves: func(req *http.Request) bool { _, ok := watched.Load(req.URL.Host); return ok }}
}

func reportMismatch(req *http.Request, err error) {
	if w, ok := watched.Load(req.URL.Host); ok {
		w.(*watch).tb.Errorf("openapi: %v", err)
	}
}

func observe(op string, x openapicheck.Exchange) {
	if w, ok := watched.Load(x.Req.URL.Host); ok && w.(*watch).observe != nil {
		w.(*watch).observe(op, x)
	}
}

// watchHost sends the OpenAPI problems of requests to rawURL's host to tb,
// until tb ends.
func watchHost(tb testing.TB, rawURL string) {
	u, err := url.Parse(rawURL)
	if err != nil {
		tb.Fatalf("watch %s: %v", rawURL, err)
	}
	w := &watch{tb: tb}
	watched.Store(u.Host, w)
	// Only this watch: a port freed here may already serve another test's
	// ledgerd, watched under the same host.
	tb.Cleanup(func() { watched.CompareAndDelete(u.Host, w) })
}

// observeHost also hands every checked exchange with rawURL's host to f.
func observeHost(tb testing.TB, rawURL string, f func(op string, x openapicheck.Exchange)) {
	u, err := url.Parse(rawURL)
	if err != nil {
		tb.Fatalf("watch %s: %v", rawURL, err)
	}
	w := &watch{tb: tb, observe: f}
	watched.Store(u.Host, w)
	tb.Cleanup(func() { watched.CompareAndDelete(u.Host, w) })
}

// coverage counts, per operation, the statuses seen, and the error codes
// seen anywhere.
type coverage struct {
	mu       sync.Mutex
	statuses map[string]map[int]bool
	codes    map[string]bool
}

func newCoverage() *coverage {
	return &coverage{statuses: map[string]map[int]bool{}, codes: map[string]bool{}}
}

func (c *coverage) observe(op string, x openapicheck.Exchange) {
	var body struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(x.RespBody, &body)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.statuses[op] == nil {
		c.statuses[op] = map[int]bool{}
	}
	c.statuses[op][x.Resp.StatusCode] = true
	if body.Error.Code != "" {
		c.codes[body.Error.Code] = true
	}
}

// missing lists the (operation, status) pairs the document declares that
// were not seen, skipping statuses in skip.
func (c *coverage) missing(doc *openapicheck.Doc, skip map[int]bool) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for path, item := range doc.T.Paths.Map() {
		for method, op := range item.Operations() {
			name := method + " " + path
			for status := range op.Responses.Map() {
				var n int
				if _, err := fmt.Sscanf(status, "%d", &n); err != nil || skip[n] {
					continue // "default"
				}
				if !c.statuses[name][n] {
					out = append(out, fmt.Sprintf("%s → %d", name, n))
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

// missingCodes lists the error codes of the document's Error schema that
// were not seen, skipping those in skip.
func (c *coverage) missingCodes(doc *openapicheck.Doc, skip map[string]bool) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	enum := doc.T.Components.Schemas["Error"].Value.Properties["error"].Value.Properties["code"].Value.Enum
	var out []string
	for _, v := range enum {
		code, _ := v.(string)
		if !skip[code] && !c.codes[code] {
			out = append(out, code)
		}
	}
	return out
}

func itoa(n int) string { return strconv.Itoa(n) }

func boolStr(b bool) string { return strconv.FormatBool(b) }
