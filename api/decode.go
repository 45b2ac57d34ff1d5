package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// MaxBodyBytes is the largest request body accepted (SPEC §4).
const MaxBodyBytes = 1 << 20

// readBody returns the members of a request's body: UTF-8 JSON holding
// one object, read by readRequestBody (before the request took its place
// in flight, see preread).
func readBody(w http.ResponseWriter, r *http.Request) (*object, error) {
	if pb, ok := r.Body.(*prereadBody); ok {
		return decodeObject(pb.data)
	}
	data, err := readRequestBody(w, r)
	if err != nil {
		return nil, err
	}
	return decodeObject(data)
}

// readRequestBody checks the content type and encoding and reads at most
// MaxBodyBytes.
func readRequestBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			return nil, &ledger.Error{Code: ledger.ECodeUnsupportedMedia,
				Message: "request body must be application/json",
				Details: map[string]any{"content_type": truncate(ct, 100)}}
		}
	}
	if err := checkContentEncoding(r); err != nil {
		// RFC 9110 §15.5.16: name the codings that would be accepted.
		w.Header().Set("Accept-Encoding", "identity")
		return nil, err
	}
	if r.ContentLength > MaxBodyBytes {
		// Refuse on the declared length, before reading anything: the
		// client gets 413 instead of "100 Continue".
		return nil, &ledger.Error{Code: ledger.ECodeBodyTooLarge,
			Message: "request body is larger than 1 MiB", Details: map[string]any{"limit": MaxBodyBytes}}
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return nil, &ledger.Error{Code: ledger.ECodeBodyTooLarge,
			Message: "request body is larger than 1 MiB", Details: map[string]any{"limit": MaxBodyBytes}}
	}
	if err != nil {
		return nil, ledger.Errorf(ledger.ECodeInvalidJSON, "request body could not be read")
	}
	return data, nil
}

// checkContentEncoding refuses a body in any content coding but identity
// (RFC 9110 §8.4): reading compressed bytes as JSON would misread them.
func checkContentEncoding(r *http.Request) error {
	for _, v := range r.Header.Values("Content-Encoding") {
		for _, c := range strings.Split(v, ",") {
			if c = strings.TrimSpace(c); c != "" && !strings.EqualFold(c, "identity") {
				return &ledger.Error{Code: ledger.ECodeUnsupportedMedia,
					Message: "request body must not be compressed (Content-Encoding: identity only)",
					Details: map[string]any{"content_encoding": truncate(v, 100)}}
			}
		}
	}
	return nil
}

// object is a decoded JSON object whose members are read once each by the
// typed accessors; the first problem is kept in err and reported by done.
type object struct {
	prefix  string // "error." for a nested object
	members map[string]json.RawMessage
	used    map[string]bool
	err     error
}

// decodeObject parses data as exactly one JSON object with unique member
// names.
func decodeObject(data []byte) (*object, error) {
	if !utf8.Valid(data) {
		return nil, ledger.Errorf(ledger.ECodeInvalidJSON, "request body is not valid UTF-8")
	}
	if !json.Valid(data) {
		return nil, &ledger.Error{Code: ledger.ECodeInvalidJSON, Message: "request body is not valid JSON" + syntaxDetail(data)}
	}
	return parseObject(data, "")
}

func syntaxDetail(data []byte) string {
	var v any
	var se *json.SyntaxError
	if err := json.Unmarshal(data, &v); errors.As(err, &se) {
		return " (at byte " + strconv.FormatInt(se.Offset, 10) + ")"
	}
	return ""
}

// parseObject reads a valid JSON value that must be an object.
func parseObject(data []byte, prefix string) (*object, error) {
	field := strings.TrimSuffix(prefix, ".")
	notObject := &ledger.Error{Code: ledger.ECodeInvalidRequest, Message: "expected a JSON object",
		Details: map[string]any{"field": field}}
	if prefix == "" {
		notObject.Message = "request body must be a JSON object"
		notObject.Details = nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, notObject
	}
	o := &object{prefix: prefix, members: map[string]json.RawMessage{}, used: map[string]bool{}}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, ledger.Errorf(ledger.ECodeInvalidJSON, "request body is not valid JSON")
		}
		name, _ := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, ledger.Errorf(ledger.ECodeInvalidJSON, "request body is not valid JSON")
		}
		if _, dup := o.members[name]; dup {
			return nil, &ledger.Error{Code: ledger.ECodeInvalidRequest,
				Message: "member " + strconv.Quote(truncate(name, 64)) + " appears twice",
				Details: map[string]any{"field": prefix + truncate(name, 64)}}
		}
		o.members[name] = raw
	}
	return o, nil
}

func (o *object) fail(name, msg string) {
	if o.err == nil {
		o.err = &ledger.Error{Code: ledger.ECodeInvalidRequest, Message: o.prefix + name + " " + msg,
			Details: map[string]any{"field": o.prefix + name}}
	}
}

// get returns a member's raw value, nil if absent or null.
func (o *object) get(name string) json.RawMessage {
	o.used[name] = true
	raw, ok := o.members[name]
	if !ok || string(raw) == "null" {
		return nil
	}
	return raw
}

// has reports whether a member is present and not null.
func (o *object) has(name string) bool { return o.get(name) != nil }

// str reads an optional string member.
func (o *object) str(name string) string {
	s, raw := o.text(name)
	if raw != nil && bytes.Contains(raw, []byte(`\u`)) && ledger.CheckIJSON(raw) != nil {
		// A lone surrogate would be stored as U+FFFD: not what was sent.
		o.fail(name, "must be an I-JSON string (RFC 7493): no lone surrogate escapes")
	}
	return s
}

// text reads an optional string member, with its JSON text (nil when
// absent or not a string).
func (o *object) text(name string) (string, []byte) {
	raw := o.get(name)
	if raw == nil {
		return "", nil
	}
	var s string
	if raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		o.fail(name, "must be a string")
		return s, nil
	}
	return s, raw
}

// key reads the idempotency_key member: what the string holds is the
// domain's to judge (invalid_key, SPEC §4), a lone surrogate escape too
// (read as U+FFFD, which is not visible ASCII).
func (o *object) key() string {
	s, _ := o.text("idempotency_key")
	return s
}

// required reads a string member that must be present.
func (o *object) required(name string) string {
	if !o.has(name) {
		o.fail(name, "is required")
		return ""
	}
	return o.str(name)
}

// integer reads an optional integer member; nil when absent.
func (o *object) integer(name string) *int64 {
	raw := o.get(name)
	if raw == nil {
		return nil
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		if raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9' {
			o.fail(name, "must be an integer in range")
		} else {
			o.fail(name, "must be an integer")
		}
		return nil
	}
	return &n
}

// boolean reads an optional boolean member; false when absent.
func (o *object) boolean(name string) bool {
	raw := o.get(name)
	switch string(raw) {
	case "", "false":
		return false
	case "true":
		return true
	}
	o.fail(name, "must be a boolean")
	return false
}

// json reads an optional member of any JSON type, nil when absent or null.
func (o *object) json(name string) json.RawMessage { return o.get(name) }

// sub reads an optional nested object; nil when absent or null.
func (o *object) sub(name string) *object {
	raw := o.get(name)
	if raw == nil {
		return nil
	}
	sub, err := parseObject(raw, o.prefix+name+".")
	if err != nil {
		if o.err == nil {
			o.err = err
		}
		return nil
	}
	return sub
}

// member reads the object member name of o with read (nil when absent);
// the first problem in it, or an unknown member of it, becomes o's.
func member[T any](o *object, name string, read func(m *object) *T) *T {
	m := o.sub(name)
	if m == nil {
		return nil
	}
	v := read(m)
	if err := m.done(); err != nil && o.err == nil {
		o.err = err
	}
	return v
}

// done reports the first problem, or an unknown member.
func (o *object) done() error {
	if o.err != nil {
		return o.err
	}
	for name := range o.members {
		if !o.used[name] {
			return &ledger.Error{Code: ledger.ECodeInvalidRequest,
				Message: "unknown field " + strconv.Quote(truncate(o.prefix+name, 64)),
				Details: map[string]any{"field": truncate(o.prefix+name, 64)}}
		}
	}
	return nil
}

// failure reads the "error" member of a commit or resolve.
func (o *object) failure() *ledger.FailureDetail {
	return member(o, "error", func(e *object) *ledger.FailureDetail {
		return &ledger.FailureDetail{Code: e.required("code"), Message: e.str("message"), Retryable: e.boolean("retryable")}
	})
}

// headerKey reads the Idempotency-Key header: a bare token or a
// structured-field string (RFC 8941). ok is false when absent.
func headerKey(r *http.Request) (key string, ok bool, err error) {
	vals := r.Header.Values("Idempotency-Key")
	if len(vals) == 0 {
		return "", false, nil
	}
	bad := &ledger.Error{Code: ledger.ECodeInvalidKey, Message: "Idempotency-Key header must be one key, bare or as a quoted string",
		Details: map[string]any{"field": "idempotency_key"}}
	if len(vals) > 1 {
		return "", false, bad
	}
	v := strings.Trim(vals[0], " \t")
	if !strings.HasPrefix(v, `"`) {
		return v, true, nil
	}
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\' && i+1 < len(v) && (v[i+1] == '"' || v[i+1] == '\\'):
			b.WriteByte(v[i+1])
			i++
		case c == '"' && i == len(v)-1:
			return b.String(), true, nil
		case c < 0x20 || c > 0x7E || c == '"' || c == '\\':
			return "", false, bad
		default:
			b.WriteByte(c)
		}
	}
	return "", false, bad // no closing quote
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
