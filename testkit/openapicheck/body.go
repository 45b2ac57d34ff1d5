package openapicheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

// bodies validates request and response bodies against the document's schemas with a JSON
// Schema 2020-12 validator (santhosh-tekuri/jsonschema, the one kin-openapi uses for OpenAPI
// 3.1), compiling each schema once. kin-openapi compiles the schema anew for every body it
// checks; over a test run that was most of the CPU the checks took.
type bodies struct {
	mu       sync.Mutex // the compiler is not safe for concurrent use
	compiler *jsonschema.Compiler
	compiled map[string]*jsonschema.Schema // by JSON pointer into the document
}

// docURL is the document's name as a schema resource.
const docURL = "mem:///openapi.json"

func newBodies(t *openapi3.T) (*bodies, error) {
	// The document as kin-openapi marshals it, $refs kept: every body schema is a location in it.
	b, err := json.Marshal(t)
	if err != nil {
		return nil, fmt.Errorf("openapi as JSON: %w", err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("openapi as JSON: %w", err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource(docURL, doc); err != nil {
		return nil, fmt.Errorf("openapi as a schema resource: %w", err)
	}
	return &bodies{compiler: c, compiled: map[string]*jsonschema.Schema{}}, nil
}

// schema returns the compiled schema at pointer (a JSON pointer into the document).
func (bs *bodies) schema(pointer string) (*jsonschema.Schema, error) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if s, ok := bs.compiled[pointer]; ok {
		return s, nil
	}
	s, err := bs.compiler.Compile(docURL + "#" + pointer)
	if err != nil {
		return nil, fmt.Errorf("compile the schema at %s: %w", pointer, err)
	}
	bs.compiled[pointer] = s
	return s, nil
}

// check validates body, sent with the Content-Type contentType, against content, whose
// location in the document is at (a JSON pointer to a content map). Like kin-openapi: a
// content type the map does not list is an error, a media type without a schema accepts any
// body, JSON media types are decoded as JSON and the others as a string.
func (bs *bodies) check(content openapi3.Content, at, contentType string, body []byte) error {
	mt := content.Get(contentType)
	if mt == nil {
		return fmt.Errorf("header Content-Type has unexpected value %q", contentType)
	}
	if mt.Schema == nil {
		return nil
	}
	name := ""
	for k, v := range content {
		if v == mt {
			name = k
		}
	}
	var value any = string(body)
	if isJSON(name) {
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
		if err != nil {
			return fmt.Errorf("failed to decode the body as JSON: %w", err)
		}
		value = v
	}
	s, err := bs.schema(at + "/" + escape(name) + "/schema")
	if err != nil {
		return err
	}
	if err := s.Validate(value); err != nil {
		return fmt.Errorf("body doesn't match schema: %#v", err) // %#v: with the keyword locations
	}
	return nil
}

// isJSON tells a JSON media type (application/json, or a +json suffix).
func isJSON(mediaType string) bool {
	mediaType, _, _ = strings.Cut(mediaType, ";")
	mediaType = strings.TrimSpace(mediaType)
	return mediaType == "application/json" || strings.HasSuffix(mediaType, "+json")
}

// escape escapes one JSON pointer token for a URI fragment (RFC 6901 §3 and §6).
func escape(token string) string {
	return url.PathEscape(strings.NewReplacer("~", "~0", "/", "~1").Replace(token))
}

// operationPointer is the pointer of a document path's operation.
func operationPointer(docPath, method string) string {
	return "/paths/" + escape(docPath) + "/" + strings.ToLower(method)
}

// refPointer turns a local $ref ("#/components/responses/X") into a pointer, or returns
// fallback when ref is empty.
func refPointer(ref, fallback string) (string, error) {
	if ref == "" {
		return fallback, nil
	}
	p, ok := strings.CutPrefix(ref, "#")
	if !ok {
		return "", fmt.Errorf("$ref %q is not local to the document", ref)
	}
	return p, nil
}

// checkRequest validates a request's body against its operation's requestBody.
func (bs *bodies) checkRequest(op *openapi3.Operation, opPointer string, req *http.Request, body []byte) error {
	rb := op.RequestBody
	if rb == nil || rb.Value == nil {
		return nil
	}
	if len(body) == 0 {
		if rb.Value.Required {
			return errors.New("request body has an error: value is required but missing")
		}
		return nil
	}
	at, err := refPointer(rb.Ref, opPointer+"/requestBody")
	if err != nil {
		return err
	}
	if err := bs.check(rb.Value.Content, at+"/content", req.Header.Get("Content-Type"), body); err != nil {
		return fmt.Errorf("request body has an error: %w", err)
	}
	return nil
}

// checkResponse validates a response's body against the response the document declares for
// its status: ref, found under responsesPointer at key.
func (bs *bodies) checkResponse(ref *openapi3.ResponseRef, responsesPointer, key string, resp *http.Response, body []byte) error {
	if ref == nil || ref.Value == nil || len(ref.Value.Content) == 0 {
		return nil
	}
	at, err := refPointer(ref.Ref, responsesPointer+"/"+escape(key))
	if err != nil {
		return err
	}
	if err := bs.check(ref.Value.Content, at+"/content", resp.Header.Get("Content-Type"), body); err != nil {
		return fmt.Errorf("response %d: %w", resp.StatusCode, err)
	}
	return nil
}

// responseFor returns the response operation op declares for status, and its key in op's
// responses ("200", "4XX" or "default"), as kin-openapi's Responses.Status and Default choose.
func responseFor(op *openapi3.Operation, status int) (*openapi3.ResponseRef, string) {
	if op.Responses == nil {
		return nil, ""
	}
	ref := op.Responses.Status(status)
	if ref == nil {
		ref = op.Responses.Default()
	}
	for k, v := range op.Responses.Map() {
		if v == ref {
			return ref, k
		}
	}
	return nil, ""
}
