package chain

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"unicode/utf8"
)

// Encodings of a stored result that is not embedded verbatim (the
// "result_encoding" member of the JSON form).
const (
	// ResultText: "result" is a JSON string whose value is the stored text.
	ResultText = "text"
	// ResultBase64: "result" is a JSON string holding the stored bytes in
	// standard base64 (the stored text is not UTF-8).
	ResultBase64 = "base64"
)

// ResultJSON returns how the JSON form carries a stored result: the JSON
// value to embed as "result", and the "result_encoding" to add beside it
// ("" for none). A result the ledger could have stored (compact JSON,
// UTF-8, not the literal null, which the ledger stores as the empty
// string) is embedded verbatim, and the empty result is null. Anything
// else (an edited file, a buggy writer) is embedded as a JSON string,
// marked, so that the output stays valid JSON and a reader still gets the
// exact stored bytes to hash.
func ResultJSON(b []byte, result string) ([]byte, string) {
	switch {
	case result == "":
		return append(b, "null"...), ""
	case result != "null" && IsCompactJSON(result):
		return append(b, result...), ""
	case utf8.ValidString(result):
		return AppendJSONString(b, result), ResultText
	default:
		b = append(b, '"')
		b = base64.StdEncoding.AppendEncode(b, []byte(result))
		return append(b, '"'), ResultBase64
	}
}

// IsCompactJSON reports whether s is one JSON value in the form the ledger
// stores results: valid JSON, valid UTF-8, and no whitespace outside
// strings (what json.Compact produces).
func IsCompactJSON(s string) bool {
	inString, escaped := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case inString && escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case c == '"':
			inString = !inString
		case !inString && (c == ' ' || c == '\t' || c == '\n' || c == '\r'):
			return false
		}
	}
	return utf8.ValidString(s) && json.Valid([]byte(s))
}

// AppendJSON appends the JSON form of r (SPEC §2) to b: the 21 fields by
// name in canonical order, result embedded verbatim (null when empty) and
// followed by result_text, the stored text as a JSON string (SPEC §9.1,
// "" for none), and prev_hash and hash as lowercase hex. No character is
// HTML-escaped, so the embedded result keeps its exact bytes. result_text
// is what a verifier hashes: it survives any re-encoding of the JSON,
// which the embedded result's bytes do not.
//
// Two members appear only on receipts no ledger writes: a stored result
// that is not compact JSON is embedded as a string and marked with
// "result_encoding" (see ResultJSON), and the fields of r.Malformed are
// null, with a "malformed" object after hash naming each one's stored
// value. A stored result that is not UTF-8 has no result_text (no JSON
// string holds its bytes): its base64 result carries them.
func (r *Receipt) AppendJSON(b []byte) []byte {
	bad := len(r.Malformed) > 0
	b = append(b, '{')
	b = r.appendU64(b, "seq", r.Seq, bad)
	b = appendField(b, "kind", r.Kind)
	b = appendField(b, "idempotency_key", r.IdempotencyKey)
	b = r.appendBool(b, "key_generated", r.KeyGenerated, bad)
	b = appendField(b, "execution_id", r.ExecutionID)
	b = r.appendU64(b, "attempt", r.Attempt, bad)
	b = appendField(b, "tool", r.Tool)
	b = appendField(b, "effect", r.Effect)
	b = r.appendBool(b, "idempotent", r.Idempotent, bad)
	b = appendField(b, "input_hash", r.InputHash)
	b = appendField(b, "outcome", r.Outcome)
	b = appendField(b, "external_ref", r.Value(FieldExternalRef))
	result := r.Value(FieldResult)
	b, enc := receiptResultJSON(appendKey(b, "result"), result)
	if enc != "" {
		b = appendField(b, "result_encoding", enc)
	}
	if enc != ResultBase64 {
		b = appendField(b, "result_text", result)
	}
	b = appendField(b, "error_code", r.ErrorCode)
	b = appendField(b, "error_message", r.Value(FieldErrorMessage))
	b = r.appendBool(b, "retryable", r.Retryable, bad)
	b = r.appendU64(b, "lease_expires_at", r.LeaseExpiresAt, bad)
	b = r.appendU64(b, "ref_seq", r.RefSeq, bad)
	b = appendField(b, "actor", r.Actor)
	b = appendField(b, "note", r.Value(FieldNote))
	b = r.appendU64(b, "recorded_at", r.RecordedAt, bad)
	b = r.appendHash(b, "prev_hash", r.PrevHash, bad)
	b = r.appendHash(b, "hash", r.Hash, bad)
	if bad {
		b = append(b, `,"malformed":{`...)
		for i, m := range r.Malformed {
			if i > 0 {
				b = append(b, ',')
			}
			b = AppendJSONString(b, m.Field)
			b = append(b, ':')
			b = AppendJSONString(b, m.Value)
		}
		b = append(b, '}')
	}
	if r.Open != nil {
		b = r.appendOpening(b)
	}
	return append(b, '}')
}

// Value is the value of payload field f: the opened value when r.Open
// holds one ("" once erased), else the chain text (an inline value, or a
// commitment whose value was not read). The JSON form shows it.
func (r *Receipt) Value(f PayloadField) string {
	if p := r.Open.Get(f); p != nil {
		return p.Value
	}
	return r.Field(f)
}

// appendOpening appends the members of a receipt shown with its values
// (SPEC §14): "commitments" (each committed field's chain text, erased
// ones too), "erased" (field → seq of the erase receipt) and "salts"
// (field → hex, for each value shown).
func (r *Receipt) appendOpening(b []byte) []byte {
	members := [3]struct {
		name string
		val  func(f PayloadField, p *Payload) ([]byte, bool)
	}{
		{"commitments", func(f PayloadField, _ *Payload) ([]byte, bool) {
			return AppendJSONString(nil, r.Field(f)), true
		}},
		{"erased", func(_ PayloadField, p *Payload) ([]byte, bool) {
			return strconv.AppendUint(nil, p.ErasedBy, 10), p.ErasedBy > 0
		}},
		{"salts", func(_ PayloadField, p *Payload) ([]byte, bool) {
			return AppendJSONString(nil, p.Salt.String()), p.ErasedBy == 0
		}},
	}
	for _, m := range members {
		b = appendKey(b, m.name)
		b = append(b, '{')
		for _, f := range PayloadFields {
			p := r.Open.Get(f)
			if p == nil {
				continue
			}
			if v, ok := m.val(f, p); ok {
				b = appendKey(b, f.Name())
				b = append(b, v...)
			}
		}
		b = append(b, '}')
	}
	return b
}

// appendU64, appendBool and appendHash append the member name with the
// value v of a field that can be malformed (nonStringFields): null when
// r.Malformed names it.

func (r *Receipt) appendU64(b []byte, name string, v uint64, bad bool) []byte {
	if b = appendKey(b, name); bad && r.IsMalformed(name) {
		return append(b, "null"...)
	}
	return strconv.AppendUint(b, v, 10)
}

func (r *Receipt) appendBool(b []byte, name string, v bool, bad bool) []byte {
	if b = appendKey(b, name); bad && r.IsMalformed(name) {
		return append(b, "null"...)
	}
	return strconv.AppendBool(b, v)
}

func (r *Receipt) appendHash(b []byte, name string, h Hash, bad bool) []byte {
	if b = appendKey(b, name); bad && r.IsMalformed(name) {
		return append(b, "null"...)
	}
	b = append(b, '"')
	b = hex.AppendEncode(b, h[:])
	return append(b, '"')
}

// MarshalJSON returns the JSON form of r. Encoders that write it must not
// HTML-escape (json.Encoder.SetEscapeHTML(false)), or the embedded result
// would change bytes.
func (r Receipt) MarshalJSON() ([]byte, error) {
	return r.AppendJSON(make([]byte, 0, 512+len(r.Result))), nil
}

type jsonReceipt struct {
	Seq            *uint64           `json:"seq"`
	Kind           *string           `json:"kind"`
	IdempotencyKey *string           `json:"idempotency_key"`
	KeyGenerated   *bool             `json:"key_generated"`
	ExecutionID    *string           `json:"execution_id"`
	Attempt        *uint64           `json:"attempt"`
	Tool           *string           `json:"tool"`
	Effect         *string           `json:"effect"`
	Idempotent     *bool             `json:"idempotent"`
	InputHash      *string           `json:"input_hash"`
	Outcome        *string           `json:"outcome"`
	ExternalRef    *string           `json:"external_ref"`
	Result         json.RawMessage   `json:"result"`
	ResultEncoding *string           `json:"result_encoding"`
	ResultText     *string           `json:"result_text"`
	ErrorCode      *string           `json:"error_code"`
	ErrorMessage   *string           `json:"error_message"`
	Retryable      *bool             `json:"retryable"`
	LeaseExpiresAt *uint64           `json:"lease_expires_at"`
	RefSeq         *uint64           `json:"ref_seq"`
	Actor          *string           `json:"actor"`
	Note           *string           `json:"note"`
	RecordedAt     *uint64           `json:"recorded_at"`
	PrevHash       *string           `json:"prev_hash"`
	Hash           *string           `json:"hash"`
	Malformed      map[string]string `json:"malformed"`
	Commitments    map[string]string `json:"commitments"`
	Erased         map[string]uint64 `json:"erased"`
	Salts          map[string]string `json:"salts"`
}

// nonStringFields are the fields whose stored value can be malformed, in
// canonical order.
var nonStringFields = []string{"seq", "key_generated", "attempt", "idempotent", "retryable",
	"lease_expires_at", "ref_seq", "recorded_at", "prev_hash", "hash"}

// UnmarshalJSON parses the JSON form of a receipt. Every field must be
// present but result_text. With result_text (SPEC §9.1), r.Result is its
// value, and the embedded result must be the same JSON value
// (DiffJSON; or, with a result_encoding, the same text), else the error
// is a *ResultMismatchError. Without it, result keeps the exact bytes it
// had in the input (null is the empty string, and a result_encoding is
// undone), so that an online verifier hashes what the server stored. A
// field named in "malformed" is null and becomes its zero value, listed
// in r.Malformed.
func (r *Receipt) UnmarshalJSON(data []byte) error {
	var j jsonReceipt
	if err := json.Unmarshal(data, &j); err != nil {
		return fmt.Errorf("decode receipt: %w", err)
	}
	if j.Result == nil {
		return fmt.Errorf("decode receipt: missing field %q", "result")
	}
	var out Receipt
	for _, name := range nonStringFields {
		if v, ok := j.Malformed[name]; ok {
			out.Malformed = append(out.Malformed, Malformed{Field: name, Value: v})
		}
	}
	if len(out.Malformed) != len(j.Malformed) {
		return fmt.Errorf("decode receipt: malformed names a field that cannot be malformed")
	}
	d := fieldDecoder{malformed: j.Malformed}
	out.Seq = d.u64("seq", j.Seq)
	out.Kind = d.str("kind", j.Kind)
	out.IdempotencyKey = d.str("idempotency_key", j.IdempotencyKey)
	out.KeyGenerated = d.bool("key_generated", j.KeyGenerated)
	out.ExecutionID = d.str("execution_id", j.ExecutionID)
	out.Attempt = d.u64("attempt", j.Attempt)
	out.Tool = d.str("tool", j.Tool)
	out.Effect = d.str("effect", j.Effect)
	out.Idempotent = d.bool("idempotent", j.Idempotent)
	out.InputHash = d.str("input_hash", j.InputHash)
	out.Outcome = d.str("outcome", j.Outcome)
	out.ExternalRef = d.str("external_ref", j.ExternalRef)
	out.ErrorCode = d.str("error_code", j.ErrorCode)
	out.ErrorMessage = d.str("error_message", j.ErrorMessage)
	out.Retryable = d.bool("retryable", j.Retryable)
	out.LeaseExpiresAt = d.u64("lease_expires_at", j.LeaseExpiresAt)
	out.RefSeq = d.u64("ref_seq", j.RefSeq)
	out.Actor = d.str("actor", j.Actor)
	out.Note = d.str("note", j.Note)
	out.RecordedAt = d.u64("recorded_at", j.RecordedAt)
	var err error
	if out.Result, err = decodeResult(j.Result, j.ResultEncoding); err != nil {
		return fmt.Errorf("decode receipt: %w", err)
	}
	if j.ResultText != nil {
		if why := resultTextMismatch(j.Result, j.ResultEncoding, out.Result, *j.ResultText); why != "" {
			return &ResultMismatchError{Seq: out.Seq, Reason: why}
		}
		out.Result = *j.ResultText
	}
	out.PrevHash, out.Hash = d.hash("prev_hash", j.PrevHash), d.hash("hash", j.Hash)
	if j.Commitments != nil {
		if err := out.decodeOpening(&j); err != nil {
			return fmt.Errorf("decode receipt: %w", err)
		}
	}
	if d.missing != "" {
		return fmt.Errorf("decode receipt: missing field %q", d.missing)
	}
	if d.err != nil {
		return d.err
	}
	*r = out
	return nil
}

// decodeOpening moves the values of the fields j's commitments name into
// r.Open, and puts each commitment in its field: r becomes the chain form
// with its opening. Each committed field has a salt or an erased mark; an
// erased field shows no value. Whether a value opens its commitment is for
// the caller to check (Opening.Check).
func (r *Receipt) decodeOpening(j *jsonReceipt) error {
	r.Open = new(Opening)
	for name, text := range j.Commitments {
		f, ok := ParsePayloadField(name)
		if !ok {
			return fmt.Errorf("commitments: %q is not a payload field", name)
		}
		p := &Payload{Value: r.Field(f), ErasedBy: j.Erased[name]}
		salt, salted := j.Salts[name]
		switch {
		case p.ErasedBy > 0 && (salted || p.Value != ""):
			return fmt.Errorf("%s: erased, yet shown with a value or a salt", name)
		case p.ErasedBy == 0 && !salted:
			return fmt.Errorf("%s: committed, with neither a salt nor an erased mark", name)
		case salted:
			var err error
			if p.Salt, err = ParseSalt(salt); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		r.Open.Set(f, p)
		r.SetField(f, text)
	}
	for name := range j.Erased {
		if _, ok := j.Commitments[name]; !ok {
			return fmt.Errorf("erased: %q has no commitment", name)
		}
	}
	for name := range j.Salts {
		if _, ok := j.Commitments[name]; !ok {
			return fmt.Errorf("salts: %q has no commitment", name)
		}
	}
	return nil
}

// fieldDecoder reads a decoded receipt's optional fields. A field that is absent is missing
// unless it is a non-string field named in malformed (its stored value was not canonical); it
// remembers the last missing field and the first hash that does not parse.
type fieldDecoder struct {
	malformed map[string]string
	missing   string
	err       error
}

// absent notes a field that is not in the JSON; a malformed non-string field may be absent.
func (d *fieldDecoder) absent(name string, mayBeMalformed bool) {
	if _, ok := d.malformed[name]; ok && mayBeMalformed {
		return
	}
	d.missing = name
}

func (d *fieldDecoder) u64(name string, p *uint64) uint64 {
	if p == nil {
		d.absent(name, true)
		return 0
	}
	return *p
}

func (d *fieldDecoder) str(name string, p *string) string {
	if p == nil {
		d.absent(name, false)
		return ""
	}
	return *p
}

func (d *fieldDecoder) bool(name string, p *bool) bool {
	if p == nil {
		d.absent(name, true)
		return false
	}
	return *p
}

func (d *fieldDecoder) hash(name string, p *string) Hash {
	if p == nil {
		d.absent(name, true)
		return Hash{}
	}
	h, err := ParseHash(*p)
	if err != nil && d.err == nil {
		d.err = fmt.Errorf("decode receipt: %s: %w", name, err)
	}
	return h
}

// decodeResult undoes ResultJSON: the stored result text from the raw
// "result" member and its "result_encoding", if any.
func decodeResult(raw json.RawMessage, enc *string) (string, error) {
	if enc == nil {
		if string(raw) == "null" {
			return "", nil
		}
		return string(raw), nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("result with result_encoding %q is not a JSON string", *enc)
	}
	switch *enc {
	case ResultText:
		return s, nil
	case ResultBase64:
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return "", fmt.Errorf("result: %w", err)
		}
		return string(b), nil
	default:
		return "", fmt.Errorf("unknown result_encoding %q", *enc)
	}
}

func appendField(b []byte, name, value string) []byte {
	return AppendJSONString(appendKey(b, name), value)
}

// appendKey appends the key of the member name, after a comma unless it
// is the object's first member (b ends with its '{': no JSON value ends
// so).
func appendKey(b []byte, name string) []byte {
	if b[len(b)-1] != '{' {
		b = append(b, ',')
	}
	b = append(b, '"')
	b = append(b, name...)
	return append(b, '"', ':')
}

const hexDigits = "0123456789abcdef"

// AppendJSONString appends s as a JSON string: quotes, backslashes and
// control characters escaped, everything else as UTF-8 (invalid bytes
// become U+FFFD).
func AppendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c < utf8.RuneSelf {
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i++
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
