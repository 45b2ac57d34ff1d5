package api_test

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
	"github.com/effect-ledger/effect-ledger/testkit/openapicheck"
)

func TestServer_OpenAPIJSON(t *testing.T) {
	t.Parallel()
	db := ledgertest.Open(t, ledgertest.WithNow(time.Now))
	path := db.Path()
	srv := MustServe(t, api.NewServer(db.Ledger, api.Config{Logger: quiet}))

	t.Run("OK", func(t *testing.T) {
		res, err := http.Get(srv.URL + "/v1/openapi.json")
		require.NoError(t, err)
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		require.NoError(t, err)
		assert.Equal(t, 200, res.StatusCode)
		assert.Equal(t, "application/json", res.Header.Get("Content-Type"))
		assert.Regexp(t, `^"[0-9a-f]{64}"$`, res.Header.Get("ETag"))

		// The served JSON is the YAML document, value for value.
		var fromYAML any
		require.NoError(t, yaml.Unmarshal(api.OpenAPIYAML, &fromYAML))
		viaJSON, err := json.Marshal(fromYAML)
		require.NoError(t, err)
		var want, got any
		require.NoError(t, json.Unmarshal(viaJSON, &want))
		require.NoError(t, json.Unmarshal(body, &got))
		assert.Equal(t, want, got)

		// And it is itself a valid OpenAPI 3.1 document.
		doc, err := openapicheck.Parse(body)
		require.NoError(t, err)
		assert.Equal(t, "3.1.0", doc.T.OpenAPI)
	})

	t.Run("NotModified", func(t *testing.T) {
		get := func(inm string) *http.Response {
			req, err := http.NewRequest("GET", srv.URL+"/v1/openapi.json", nil)
			require.NoError(t, err)
			if inm != "" {
				req.Header.Set("If-None-Match", inm)
			}
			res, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			return res
		}
		etag := get("").Header.Get("ETag")
		for _, inm := range []string{etag, "W/" + etag, `"other", ` + etag, "*"} {
			res := get(inm)
			assert.Equal(t, 304, res.StatusCode, inm)
			assert.Equal(t, etag, res.Header.Get("ETag"))
		}
		assert.Equal(t, 200, get(`"stale"`).StatusCode)
	})

	t.Run("PublicWithTokens", func(t *testing.T) {
		toks := MustOpenTokens(t, path)
		mustCreate(t, toks, "bot", ledger.RoleReader)
		srv := MustServe(t, api.NewServer(db.Ledger, api.Config{Logger: quiet})) // a new server reads auth at once
		assert.Equal(t, 401, do(t, srv, "GET", "/v1/head", "").status)
		assert.Equal(t, 200, do(t, srv, "GET", "/v1/openapi.json", "").status)
	})
}

// TestServer_Routes keeps the router and api/openapi.yaml in step: every
// route the server serves is described with the same methods, and every
// described operation is served.
func TestServer_Routes(t *testing.T) {
	t.Parallel()
	db := ledgertest.Open(t, ledgertest.WithNow(time.Now))
	s := api.NewServer(db.Ledger, api.Config{Logger: quiet})
	doc, err := openapicheck.Load()
	require.NoError(t, err)

	varPattern := regexp.MustCompile(`\{([^}:]+):[^}]*\}`)
	emptyVar := regexp.MustCompile(`\{[^}:]+:\.\*\}$`) // matches the empty string too
	served := map[string]bool{}
	methods := map[string][]string{} // path → methods, over every route of the path
	for _, r := range s.Routes() {
		paths := []string{varPattern.ReplaceAllString(r.Path, "{$1}")}
		if emptyVar.MatchString(r.Path) {
			paths = append(paths, emptyVar.ReplaceAllString(r.Path, "")) // "/ui/{file:.*}" serves "/ui/" too
		}
		for _, path := range paths {
			if r.Methods == nil {
				// Only the reserve path (in both forms) has a catch-all,
				// answering 405 to every method but POST (not a lookup of
				// a key "reserve").
				assert.Contains(t, []string{"/v1/effects/reserve", "/v1/ns/{ns}/effects/reserve"}, path, "a route without methods")
				continue
			}
			methods[path] = append(methods[path], r.Methods...)
			for _, m := range r.Methods {
				served[m+" "+path] = true
			}
		}
	}
	for path, got := range methods {
		slices.Sort(got)
		want := doc.Methods(path)
		assert.Equal(t, want, got, "methods of %s: the server serves %v, api/openapi.yaml describes %v", path, got, want)
	}
	for _, op := range doc.Operations() {
		if !served[op] {
			t.Errorf("%s is described in api/openapi.yaml but not served", op)
		}
	}
}

func TestYAMLToJSON(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		desc, yaml, want, wantErr string
	}{
		{desc: "OK order and types", yaml: "b: 1\na: [x, 2.5, true, null]\n'200': {c: \"3\"}\n",
			want: `{"b":1,"a":["x",2.5,true,null],"200":{"c":"3"}}`},
		{desc: "OK quoted stays string", yaml: "version: \"1.1\"\nopenapi: 3.1.0\ncode: '200'\n",
			want: `{"version":"1.1","openapi":"3.1.0","code":"200"}`},
		{desc: "OK alias", yaml: "a: &x {k: v}\nb: *x\n", want: `{"a":{"k":"v"},"b":{"k":"v"}}`},
		{desc: "OK block text", yaml: "d: |\n  line 1\n  \"q\" <b>\n", want: `{"d":"line 1\n\"q\" \u003cb\u003e\n"}`},
		{desc: "OK int key", yaml: "200: ok\n", want: `{"200":"ok"}`},
		{desc: "ErrSyntax", yaml: "a: [1\n", wantErr: "parse yaml"},
		{desc: "ErrDuplicateKey", yaml: "a: 1\na: 2\n", wantErr: "a"},
		{desc: "ErrNaN", yaml: "a: .nan\n", wantErr: "line 1"},
		{desc: "ErrComplexKey", yaml: "? [a]\n: 1\n", wantErr: "not a scalar"},
		{desc: "ErrEmpty", yaml: "", wantErr: "document"},
		{desc: "ErrMerge", yaml: "a: &x {k: v}\nb:\n  <<: *x\n", wantErr: "merge"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			got, err := api.YAMLToJSON([]byte(tc.yaml))
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, string(got), "same values, keys in order")
		})
	}
}
