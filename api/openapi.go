package api

import (
	"bytes"
	"crypto/sha256"
	_ "embed" // the OpenAPI document
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/gorilla/mux"
	"go.yaml.in/yaml/v3"
)

// OpenAPIYAML is the OpenAPI 3.1 description of every route the server
// serves (api/openapi.yaml), as written.
//
//go:embed openapi.yaml
var OpenAPIYAML []byte

// openAPI is the document converted to JSON once, with its ETag.
var openAPI = sync.OnceValues(func() (openAPIDoc, error) {
	js, err := YAMLToJSON(OpenAPIYAML)
	if err != nil {
		return openAPIDoc{}, fmt.Errorf("openapi.yaml: %w", err)
	}
	sum := sha256.Sum256(js)
	return openAPIDoc{json: js, etag: `"` + hex.EncodeToString(sum[:]) + `"`}, nil
})

type openAPIDoc struct {
	json []byte
	etag string
}

// OpenAPIJSON returns the OpenAPI document as JSON, as GET /v1/openapi.json
// serves it.
func OpenAPIJSON() ([]byte, error) {
	d, err := openAPI()
	return d.json, err
}

// handleOpenAPI serves the OpenAPI document as JSON. It is public: it holds
// nothing a client could not learn from the project itself.
func (s *Server) handleOpenAPI(w http.ResponseWriter, r *http.Request) {
	d, err := openAPI()
	if err != nil {
		s.Error(w, r, err)
		return
	}
	w.Header().Set("ETag", d.etag)
	if etagMatches(r.Header.Get("If-None-Match"), d.etag) {
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusNotModified)
		return
	}
	// The document changes only with the binary: caches may keep it if
	// they revalidate it with the ETag.
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(d.json)))
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(d.json)
}

// etagMatches reports whether an If-None-Match header names etag.
func etagMatches(header, etag string) bool {
	for _, v := range strings.Split(header, ",") {
		v = strings.TrimSpace(v)
		if v == "*" || strings.TrimPrefix(v, "W/") == etag {
			return true
		}
	}
	return false
}

// Route is one route the server serves: its path template and methods.
type Route struct {
	Path    string
	Methods []string
}

// Routes lists every route of the server in registration order, with the
// path template as the router has it (for example "/v1/effects/{key}").
// A route that takes every method has Methods nil.
func (s *Server) Routes() []Route {
	var out []Route
	_ = s.router.Walk(func(route *mux.Route, _ *mux.Router, _ []*mux.Route) error {
		tpl, err := route.GetPathTemplate()
		if err != nil {
			return nil // a route without a path; we register none
		}
		methods, _ := route.GetMethods()
		out = append(out, Route{Path: tpl, Methods: methods})
		return nil
	})
	return out
}

// YAMLToJSON converts a YAML document to compact JSON, keeping the order
// of mapping keys. Scalars keep their YAML types (a quoted "200" stays a
// string, 200 becomes a number); anchors and aliases are expanded. Mapping
// keys must be scalars.
func YAMLToJSON(y []byte) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(y, &doc); err != nil {
		return nil, fmt.Errorf("parse yaml: %w", err)
	}
	if doc.Kind == 0 {
		return nil, errors.New("convert yaml: empty document")
	}
	var b bytes.Buffer
	if err := appendYAMLNode(&b, &doc, 0); err != nil {
		return nil, err
	}
	if !json.Valid(b.Bytes()) {
		return nil, errors.New("convert yaml: produced invalid JSON")
	}
	return b.Bytes(), nil
}

// maxYAMLDepth bounds nesting (and alias expansion) of converted documents.
const maxYAMLDepth = 100

func appendYAMLNode(b *bytes.Buffer, n *yaml.Node, depth int) error {
	if depth > maxYAMLDepth {
		return errors.New("convert yaml: nested too deeply")
	}
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) != 1 {
			return errors.New("convert yaml: want exactly one document")
		}
		return appendYAMLNode(b, n.Content[0], depth+1)
	case yaml.AliasNode:
		return appendYAMLNode(b, n.Alias, depth+1)
	case yaml.MappingNode:
		b.WriteByte('{')
		seen := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				return fmt.Errorf("convert yaml: line %d: mapping key is not a scalar", k.Line)
			}
			if k.Tag == "!!merge" {
				return fmt.Errorf("convert yaml: line %d: merge keys are not supported", k.Line)
			}
			if seen[k.Value] {
				return fmt.Errorf("convert yaml: line %d: duplicate key %q", k.Line, k.Value)
			}
			seen[k.Value] = true
			if i > 0 {
				b.WriteByte(',')
			}
			writeJSONString(b, k.Value)
			b.WriteByte(':')
			if err := appendYAMLNode(b, v, depth+1); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	case yaml.SequenceNode:
		b.WriteByte('[')
		for i, c := range n.Content {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := appendYAMLNode(b, c, depth+1); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case yaml.ScalarNode:
		return appendYAMLScalar(b, n)
	default:
		return fmt.Errorf("convert yaml: line %d: unexpected node kind %d", n.Line, n.Kind)
	}
	return nil
}

func appendYAMLScalar(b *bytes.Buffer, n *yaml.Node) error {
	switch n.ShortTag() {
	case "!!str":
		writeJSONString(b, n.Value)
	case "!!null":
		b.WriteString("null")
	case "!!bool":
		var v bool
		if err := n.Decode(&v); err != nil {
			return fmt.Errorf("convert yaml: line %d: %w", n.Line, err)
		}
		b.WriteString(strconv.FormatBool(v))
	case "!!int":
		var v int64
		if err := n.Decode(&v); err != nil {
			return fmt.Errorf("convert yaml: line %d: %w", n.Line, err)
		}
		b.WriteString(strconv.FormatInt(v, 10))
	case "!!float":
		var v float64
		if err := n.Decode(&v); err != nil {
			return fmt.Errorf("convert yaml: line %d: %w", n.Line, err)
		}
		js, err := json.Marshal(v)
		if err != nil { // NaN and infinities have no JSON form
			return fmt.Errorf("convert yaml: line %d: %w", n.Line, err)
		}
		b.Write(js)
	default:
		return fmt.Errorf("convert yaml: line %d: unsupported tag %s", n.Line, n.ShortTag())
	}
	return nil
}

func writeJSONString(b *bytes.Buffer, s string) {
	js, _ := json.Marshal(s) // a string always encodes
	b.Write(js)
}
