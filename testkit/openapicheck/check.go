// Package openapicheck validates real HTTP exchanges with ledgerd against
// its OpenAPI document (api/openapi.yaml). Tests install a Transport in
// their HTTP client, so every request they make, and its response, is
// checked: the response must be one the document declares for that route,
// status and content type, with a body and headers that match their
// schemas; and a request the document forbids must not succeed.
package openapicheck

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/effect-ledger/effect-ledger/api"
)

// Doc is a loaded, validated OpenAPI document with its router.
type Doc struct {
	T      *openapi3.T
	router routers.Router
	bodies *bodies
	// docPath maps a path as routed (with its x-path-regexp parameters
	// spelled out) back to the document's path.
	docPath map[string]string
}

var (
	loadOnce sync.Once
	loaded   *Doc
	loadErr  error
)

// Load parses api/openapi.yaml (as embedded in the api package), checks
// that it is a valid OpenAPI document (examples included) and returns it.
func Load() (*Doc, error) {
	loadOnce.Do(func() { loaded, loadErr = Parse(api.OpenAPIYAML) })
	return loaded, loadErr
}

// Parse loads and validates an OpenAPI document.
func Parse(data []byte) (*Doc, error) {
	l := openapi3.NewLoader()
	t, err := l.LoadFromData(data)
	if err != nil {
		return nil, fmt.Errorf("load openapi: %w", err)
	}
	if err := t.Validate(l.Context); err != nil {
		return nil, fmt.Errorf("validate openapi: %w", err)
	}
	// Match requests to any host: tests serve on random ports.
	routed := *t
	routed.Servers = nil
	paths, docPath, err := multiSegment(t.Paths)
	if err != nil {
		return nil, err
	}
	routed.Paths = paths
	r, err := gorillamux.NewRouter(&routed)
	if err != nil {
		return nil, fmt.Errorf("openapi router: %w", err)
	}
	bs, err := newBodies(t)
	if err != nil {
		return nil, err
	}
	return &Doc{T: t, router: r, docPath: docPath, bodies: bs}, nil
}

// multiSegment returns paths with every path parameter that has an
// x-path-regexp extension spelled as {name:regexp}, so that the router
// matches values that span several segments (a tile path such as
// tile/0/x001/234.p/5; an OpenAPI path parameter cannot hold a '/'), and
// the map from each rewritten path back to the document's.
func multiSegment(in *openapi3.Paths) (*openapi3.Paths, map[string]string, error) {
	out := openapi3.NewPaths()
	docPath := map[string]string{}
	for path, item := range in.Map() {
		routed := path
		params := slices.Clone(item.Parameters)
		for _, op := range item.Operations() {
			params = append(params, op.Parameters...)
		}
		for _, p := range params {
			if p.Value == nil || p.Value.In != openapi3.ParameterInPath {
				continue
			}
			v, ok := p.Value.Extensions["x-path-regexp"]
			if !ok {
				continue
			}
			re, ok := v.(string)
			if !ok || re == "" || strings.ContainsAny(re, "{}") {
				return nil, nil, fmt.Errorf("openapi: %s: parameter %s: x-path-regexp must be a regexp without braces", path, p.Value.Name)
			}
			routed = strings.Replace(routed, "{"+p.Value.Name+"}", "{"+p.Value.Name+":"+re+"}", 1)
		}
		out.Set(routed, item)
		docPath[routed] = path
	}
	return out, docPath, nil
}

func init() {
	// Bodies the API serves that are not JSON.
	openapi3filter.RegisterBodyDecoder("text/html", openapi3filter.PlainBodyDecoder)
	for _, ct := range []string{"application/openmetrics-text", "text/css", "text/javascript", "image/svg+xml"} {
		openapi3filter.RegisterBodyDecoder(ct, openapi3filter.PlainBodyDecoder)
	}
}

// Operations lists every operation of the document as "METHOD /path",
// sorted.
func (d *Doc) Operations() []string {
	var out []string
	for path, item := range d.T.Paths.Map() {
		for method := range item.Operations() {
			out = append(out, method+" "+path)
		}
	}
	slices.Sort(out)
	return out
}

// Methods returns the methods the document lists for path, sorted; nil
// for a path it does not have.
func (d *Doc) Methods(path string) []string {
	item := d.T.Paths.Value(path)
	if item == nil {
		return nil
	}
	var out []string
	for m := range item.Operations() {
		out = append(out, m)
	}
	slices.Sort(out)
	return out
}

// Exchange is one request and its response, with both bodies read.
type Exchange struct {
	Req      *http.Request
	ReqBody  []byte
	Resp     *http.Response
	RespBody []byte
}

// JSONExchange is an exchange written out, for checking the document
// without a server: a request method path (on http://127.0.0.1:8080)
// with reqBody, answered with status, respBody and the response headers
// header (name, value, …). A body that is not empty is application/json.
func JSONExchange(method, path, reqBody string, status int, respBody string, header ...string) Exchange {
	req := httptest.NewRequest(method, "http://127.0.0.1:8080"+path, strings.NewReader(reqBody))
	if reqBody != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp := &http.Response{StatusCode: status, Header: http.Header{}}
	if respBody != "" {
		resp.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		resp.Header.Set(header[i], header[i+1])
	}
	return Exchange{Req: req, ReqBody: []byte(reqBody), Resp: resp, RespBody: []byte(respBody)}
}

// Check validates one exchange against the document and returns the
// operation it matched ("POST /v1/effects/reserve"; empty for a path or
// method the document does not have) and every problem found, or nil.
func (d *Doc) Check(ctx context.Context, x Exchange) (string, error) {
	req := x.Req.Clone(ctx)
	req.Body = io.NopCloser(bytes.NewReader(x.ReqBody))
	// The server refuses some requests before it chooses a route.
	switch x.Resp.StatusCode {
	case http.StatusRequestHeaderFieldsTooLarge:
		return "", d.checkComponent(ctx, req, x, "HeadersTooLarge", x.Resp.StatusCode)
	case http.StatusNotImplemented:
		return "", d.checkComponent(ctx, req, x, "NotImplemented", x.Resp.StatusCode)
	}
	route, params, err := d.router.FindRoute(req)
	switch {
	case errors.Is(err, routers.ErrPathNotFound):
		return "", d.checkComponent(ctx, req, x, "NotFound", http.StatusNotFound)
	case errors.Is(err, routers.ErrMethodNotAllowed):
		if err := d.checkComponent(ctx, req, x, "MethodNotAllowed", http.StatusMethodNotAllowed); err != nil {
			return "", err
		}
		return "", d.checkAllow(req, x.Resp.Header.Get("Allow"))
	case err != nil:
		return "", fmt.Errorf("find route: %w", err)
	}
	op := route.Method + " " + d.docPath[route.Path]

	// Bodies are checked by d.bodies, which compiles each schema once.
	opts := &openapi3filter.Options{
		AuthenticationFunc:    openapi3filter.NoopAuthenticationFunc,
		IncludeResponseStatus: true,
		MultiError:            true,
		SkipSettingDefaults:   true,
		ExcludeRequestBody:    true,
		ExcludeResponseBody:   true,
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: opts}
	opPointer := operationPointer(d.docPath[route.Path], route.Method)
	var problems []error
	if x.Resp.StatusCode < 400 {
		reqErr := errors.Join(openapi3filter.ValidateRequest(ctx, in),
			d.bodies.checkRequest(route.Operation, opPointer, req, x.ReqBody))
		if reqErr != nil {
			problems = append(problems, fmt.Errorf("the server answered %d to a request the document forbids: %w",
				x.Resp.StatusCode, reqErr))
		}
	}
	out := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in,
		Status:                 x.Resp.StatusCode,
		Header:                 x.Resp.Header,
		Options:                opts,
	}
	out.SetBodyBytes(x.RespBody)
	if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
		problems = append(problems, fmt.Errorf("response: %w", err))
	}
	if checksBody(req, x.Resp.StatusCode) {
		ref, key := responseFor(route.Operation, x.Resp.StatusCode)
		if err := d.bodies.checkResponse(ref, opPointer+"/responses", key, x.Resp, x.RespBody); err != nil {
			problems = append(problems, fmt.Errorf("response: %w", err))
		}
	}
	if req.Method == http.MethodHead && route.Operation.Responses.Status(x.Resp.StatusCode) == nil &&
		route.Operation.Responses.Default() == nil {
		problems = append(problems, fmt.Errorf("response: status %d is not declared", x.Resp.StatusCode))
	}
	if err := errors.Join(problems...); err != nil {
		return op, fmt.Errorf("%s: %w", op, err)
	}
	return op, nil
}

// checkComponent validates a response that no operation declares (an
// unknown path, a method a path does not serve) against the document's
// shared response component name, which must have status want.
func (d *Doc) checkComponent(ctx context.Context, req *http.Request, x Exchange, name string, want int) error {
	where := fmt.Sprintf("%s %s (no operation)", req.Method, req.URL.EscapedPath())
	if x.Resp.StatusCode != want {
		return fmt.Errorf("%s: status %d, the document says %d (components/responses/%s)",
			where, x.Resp.StatusCode, want, name)
	}
	if req.Method == http.MethodHead {
		return nil
	}
	ref := d.T.Components.Responses[name]
	if ref == nil || ref.Value == nil {
		return fmt.Errorf("%s: the document has no components/responses/%s", where, name)
	}
	// Validate as if an operation declared exactly this response.
	op := openapi3.NewOperation()
	op.Responses = openapi3.NewResponses(openapi3.WithStatus(want, ref))
	route := &routers.Route{Spec: d.T, Path: req.URL.Path, Method: req.Method, Operation: op}
	in := &openapi3filter.RequestValidationInput{Request: req, Route: route}
	out := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in,
		Status:                 x.Resp.StatusCode,
		Header:                 x.Resp.Header,
		Options:                &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true, ExcludeResponseBody: true},
	}
	out.SetBodyBytes(x.RespBody)
	err := errors.Join(openapi3filter.ValidateResponse(ctx, out),
		d.bodies.checkResponse(ref, "/components/responses", name, x.Resp, x.RespBody))
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	return nil
}

// checksBody tells whether a response's body is checked: not for HEAD and not for redirects
// (kin-openapi's ValidateResponse skips them too).
func checksBody(req *http.Request, status int) bool {
	switch status {
	case http.StatusNotModified, http.StatusPermanentRedirect, http.StatusTemporaryRedirect, http.StatusMovedPermanently:
		return false
	}
	return req.Method != http.MethodHead
}

// checkAllow compares the Allow header of a 405 with the methods the
// document lists for the request's URL.
func (d *Doc) checkAllow(req *http.Request, allow string) error {
	var want []string
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut,
		http.MethodPatch, http.MethodDelete, http.MethodOptions} {
		probe := req.Clone(req.Context())
		probe.Method = m
		if _, _, err := d.router.FindRoute(probe); err == nil {
			want = append(want, m)
		}
	}
	slices.Sort(want)
	var got []string
	for _, m := range strings.Split(allow, ",") {
		if m = strings.TrimSpace(m); m != "" {
			got = append(got, m)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		return fmt.Errorf("%s %s: Allow is %q, the document lists %v", req.Method, req.URL.EscapedPath(), allow, want)
	}
	return nil
}

// Transport is an http.RoundTripper that checks every exchange it carries
// against a Doc and hands each problem to Report. A request that fails in
// transport (the server died) is passed through unchecked.
type Transport struct {
	Base http.RoundTripper
	Doc  *Doc
	// Report receives each problem (required).
	Report func(req *http.Request, err error)
	// Observe, if set, sees every checked exchange with the operation it
	// matched (empty for none), for coverage accounting.
	Observe func(op string, x Exchange)
	// Serves, if set, tells which requests go to a server the document
	// describes; the others pass through unchecked.
	Serves func(req *http.Request) bool
}

// RoundTrip sends req, reads the whole response, checks the exchange and
// returns the response with its body rewound.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.Serves != nil && !t.Serves(req) {
		return t.Base.RoundTrip(req)
	}
	var reqBody []byte
	if req.Body != nil && req.Body != http.NoBody {
		b, err := io.ReadAll(req.Body)
		_ = req.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("openapicheck: read request body: %w", err)
		}
		reqBody = b
		req = req.Clone(req.Context())
		req.Body = io.NopCloser(bytes.NewReader(b))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
	}
	resp, err := t.Base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	respBody, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("openapicheck: read response body: %w", err)
	}
	resp.Body = io.NopCloser(bytes.NewReader(respBody))
	x := Exchange{Req: req, ReqBody: reqBody, Resp: resp, RespBody: respBody}
	op, err := t.Doc.Check(context.Background(), x)
	if err != nil {
		t.Report(req, err)
	}
	if t.Observe != nil {
		t.Observe(op, x)
	}
	return resp, nil
}
