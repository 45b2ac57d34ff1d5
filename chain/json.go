package chain

import (
	"encoding/json"
	"fmt"
	"strconv"
	"unicode/utf8"
)

// AppendJSON appends the JSON form of r (SPEC §2) to b: the 21 fields by
// name in canonical order, result embedded verbatim (null when empty), and
// prev_hash and hash as lowercase hex. No character is HTML-escaped, so the
// embedded result keeps its exact bytes.
func (r *Receipt) AppendJSON(b []byte) []byte {
	b = append(b, `{"seq":`...)
	b = strconv.AppendUint(b, r.Seq, 10)
	b = appendField(b, "kind", r.Kind)
	b = appendField(b, "idempotency_key", r.IdempotencyKey)
	b = append(b, `,"key_generated":`...)
	b = strconv.AppendBool(b, r.KeyGenerated)
	b = appendField(b, "execution_id", r.ExecutionID)
	b = append(b, `,"attempt":`...)
	b = strconv.AppendUint(b, r.Attempt, 10)
	b = appendField(b, "tool", r.Tool)
	b = appendField(b, "effect", r.Effect)
	b = append(b, `,"idempotent":`...)
	b = strconv.AppendBool(b, r.Idempotent)
	b = appendField(b, "input_hash", r.InputHash)
	b = appendField(b, "outcome", r.Outcome)
	b = appendField(b, "external_ref", r.ExternalRef)
	b = append(b, `,"result":`...)
	if r.Result == "" {
		b = append(b, "null"...)
	} else {
		b = append(b, r.Result...)
	}
	b = appendField(b, "error_code", r.ErrorCode)
	b = appendField(b, "error_message", r.ErrorMessage)
	b = append(b, `,"retryable":`...)
	b = strconv.AppendBool(b, r.Retryable)
	b = append(b, `,"lease_expires_at":`...)
	b = strconv.AppendUint(b, r.LeaseExpiresAt, 10)
	b = append(b, `,"ref_seq":`...)
	b = strconv.AppendUint(b, r.RefSeq, 10)
	b = appendField(b, "actor", r.Actor)
	b = appendField(b, "note", r.Note)
	b = append(b, `,"recorded_at":`...)
	b = strconv.AppendUint(b, r.RecordedAt, 10)
	b = appendField(b, "prev_hash", r.PrevHash.String())
	b = appendField(b, "hash", r.Hash.String())
	return append(b, '}')
}

// MarshalJSON returns the JSON form of r. Encoders that write it must not
// HTML-escape (json.Encoder.SetEscapeHTML(false)), or the embedded result
// would change bytes.
func (r Receipt) MarshalJSON() ([]byte, error) {
	return r.AppendJSON(make([]byte, 0, 512+len(r.Result))), nil
}

type jsonReceipt struct {
	Seq            *uint64         `json:"seq"`
	Kind           *string         `json:"kind"`
	IdempotencyKey *string         `json:"idempotency_key"`
	KeyGenerated   *bool           `json:"key_generated"`
	ExecutionID    *string         `json:"execution_id"`
	Attempt        *uint64         `json:"attempt"`
	Tool           *string         `json:"tool"`
	Effect         *string         `json:"effect"`
	Idempotent     *bool           `json:"idempotent"`
	InputHash      *string         `json:"input_hash"`
	Outcome        *string         `json:"outcome"`
	ExternalRef    *string         `json:"external_ref"`
	Result         json.RawMessage `json:"result"`
	ErrorCode      *string         `json:"error_code"`
	ErrorMessage   *string         `json:"error_message"`
	Retryable      *bool           `json:"retryable"`
	LeaseExpiresAt *uint64         `json:"lease_expires_at"`
	RefSeq         *uint64         `json:"ref_seq"`
	Actor          *string         `json:"actor"`
	Note           *string         `json:"note"`
	RecordedAt     *uint64         `json:"recorded_at"`
	PrevHash       *string         `json:"prev_hash"`
	Hash           *string         `json:"hash"`
}

// UnmarshalJSON parses the JSON form of a receipt. Every field must be
// present; result keeps the exact bytes it had in the input (null is the
// empty string), so that an online verifier hashes what the server stored.
func (r *Receipt) UnmarshalJSON(data []byte) error {
	var j jsonReceipt
	if err := json.Unmarshal(data, &j); err != nil {
		return fmt.Errorf("decode receipt: %w", err)
	}
	if j.Result == nil {
		return fmt.Errorf("decode receipt: missing field %q", "result")
	}
	var missing string
	u := func(name string, p *uint64) uint64 {
		if p == nil {
			missing = name
			return 0
		}
		return *p
	}
	s := func(name string, p *string) string {
		if p == nil {
			missing = name
			return ""
		}
		return *p
	}
	bl := func(name string, p *bool) bool {
		if p == nil {
			missing = name
			return false
		}
		return *p
	}
	out := Receipt{
		Seq:            u("seq", j.Seq),
		Kind:           s("kind", j.Kind),
		IdempotencyKey: s("idempotency_key", j.IdempotencyKey),
		KeyGenerated:   bl("key_generated", j.KeyGenerated),
		ExecutionID:    s("execution_id", j.ExecutionID),
		Attempt:        u("attempt", j.Attempt),
		Tool:           s("tool", j.Tool),
		Effect:         s("effect", j.Effect),
		Idempotent:     bl("idempotent", j.Idempotent),
		InputHash:      s("input_hash", j.InputHash),
		Outcome:        s("outcome", j.Outcome),
		ExternalRef:    s("external_ref", j.ExternalRef),
		ErrorCode:      s("error_code", j.ErrorCode),
		ErrorMessage:   s("error_message", j.ErrorMessage),
		Retryable:      bl("retryable", j.Retryable),
		LeaseExpiresAt: u("lease_expires_at", j.LeaseExpiresAt),
		RefSeq:         u("ref_seq", j.RefSeq),
		Actor:          s("actor", j.Actor),
		Note:           s("note", j.Note),
		RecordedAt:     u("recorded_at", j.RecordedAt),
	}
	if string(j.Result) != "null" {
		out.Result = string(j.Result)
	}
	prev, hash := s("prev_hash", j.PrevHash), s("hash", j.Hash)
	if missing != "" {
		return fmt.Errorf("decode receipt: missing field %q", missing)
	}
	var err error
	if out.PrevHash, err = ParseHash(prev); err != nil {
		return fmt.Errorf("decode receipt: prev_hash: %w", err)
	}
	if out.Hash, err = ParseHash(hash); err != nil {
		return fmt.Errorf("decode receipt: hash: %w", err)
	}
	*r = out
	return nil
}

func appendField(b []byte, name, value string) []byte {
	b = append(b, ',', '"')
	b = append(b, name...)
	b = append(b, '"', ':')
	return AppendJSONString(b, value)
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
