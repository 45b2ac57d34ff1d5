package chain

import (
	"encoding/json"
	"errors"
	"fmt"
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
