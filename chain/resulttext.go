package chain

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ErrResultMismatch is the parent of every ResultMismatchError.
var ErrResultMismatch = errors.New("the embedded result is not result_text")

// ResultMismatchError reports a JSON receipt whose embedded result is not
// the value of its result_text (SPEC §9.1): the receipt is invalid, since
// a reader would be shown one result and the hash would cover another.
type ResultMismatchError struct {
	Seq    uint64
	Reason string // where and how they differ, or which side is not JSON
}

func (e *ResultMismatchError) Error() string {
	return fmt.Sprintf("receipt %d: the embedded result does not equal result_text (SPEC §9.1): %s", e.Seq, e.Reason)
}

// Unwrap returns ErrResultMismatch.
func (e *ResultMismatchError) Unwrap() error { return ErrResultMismatch }

// resultTextMismatch says why the raw "result" member (whose
// result_encoding, if any, decoded to stored) is not the result_text
// text, "" when it is: with a result_encoding, the decoded text must be
// text exactly; a null result goes with "" only; any other result must be
// the same JSON value as text.
func resultTextMismatch(raw json.RawMessage, enc *string, stored, text string) string {
	switch {
	case enc != nil && stored != text:
		return fmt.Sprintf("result (result_encoding %q) holds other text than result_text", *enc)
	case enc != nil:
		return ""
	case string(raw) == "null" && text != "":
		return "result is null, result_text is not empty"
	case string(raw) == "null":
		return ""
	case text == "":
		return "result_text is empty (no result), result is not null"
	}
	va, err := parseJSON(raw)
	if err != nil {
		return fmt.Sprintf("result: %v", err)
	}
	vt, err := parseJSON([]byte(text))
	if err != nil {
		return fmt.Sprintf("result_text: %v", err)
	}
	return diffJSON("$", va, vt, "result", "result_text")
}

// receiptResultJSON is ResultJSON for a receipt's result, which a verifier
// compares with result_text (SPEC §9.1): a stored result with an object
// that has a member name twice, or a lone surrogate escape (today's ledger
// refuses both, as not I-JSON; an early ledger or an edited file may hold
// one) is not embedded verbatim
// but as the JSON string of its text, marked "text", since no JSON tool
// keeps both members and §9.1 compares objects as maps with unique names;
// its portable receipt then still verifies.
func receiptResultJSON(b []byte, result string) ([]byte, string) {
	if result != "" && result != "null" && IsCompactJSON(result) &&
		(hasDuplicateNames(result) || loneSurrogate([]byte(result)) != nil) {
		return AppendJSONString(b, result), ResultText
	}
	return ResultJSON(b, result)
}

// hasDuplicateNames reports whether the valid JSON text s has an object
// with a member name twice (names compared by their decoded value).
func hasDuplicateNames(s string) bool {
	type container struct {
		object    bool
		wantName  bool
		names     []string
		nameIndex map[string]bool // once names grow long
	}
	var stack []container
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '{':
			stack = append(stack, container{object: true, wantName: true})
		case '[':
			stack = append(stack, container{})
		case '}', ']':
			stack = stack[:len(stack)-1]
		case ',':
			if top := len(stack) - 1; top >= 0 && stack[top].object {
				stack[top].wantName = true
			}
		case '"':
			end := i + 1
			for ; s[end] != '"'; end++ {
				if s[end] == '\\' {
					end++
				}
			}
			top := len(stack) - 1
			if top >= 0 && stack[top].wantName {
				c := &stack[top]
				c.wantName = false
				name := s[i+1 : end]
				if strings.IndexByte(name, '\\') >= 0 {
					_ = json.Unmarshal([]byte(s[i:end+1]), &name)
				}
				if c.nameIndex == nil && len(c.names) >= 16 {
					c.nameIndex = make(map[string]bool, 2*len(c.names))
					for _, n := range c.names {
						c.nameIndex[n] = true
					}
				}
				if c.nameIndex != nil {
					if c.nameIndex[name] {
						return true
					}
					c.nameIndex[name] = true
				} else if slices.Contains(c.names, name) {
					return true
				}
				c.names = append(c.names, name)
			}
			i = end
		}
	}
	return false
}
