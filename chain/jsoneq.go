package chain

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// JSON equality of SPEC §9.1: a portable receipt's embedded result must be
// the same JSON value as its result_text, whatever a JSON tool did to its
// bytes. Objects are maps whose member names must be unique (a name given
// twice makes the value invalid, not equal to anything), arrays are
// compared in order, strings by their decoded value, and numbers as exact
// decimals: 1.0, 1 and 1e0 are equal, 9007199254740993 and
// 9007199254740992 are not (no float64 anywhere).

// DiffJSON compares the JSON values a and b. It returns "" when they are
// equal, else where and how they first differ ("at $.amount: 1200 in the
// first, 1300 in the second"). The error reports a side that is not one
// JSON value in UTF-8 or has an object with a member name twice.
func DiffJSON(a, b []byte) (string, error) {
	va, err := parseJSON(a)
	if err != nil {
		return "", fmt.Errorf("first value: %w", err)
	}
	vb, err := parseJSON(b)
	if err != nil {
		return "", fmt.Errorf("second value: %w", err)
	}
	return diffJSON("$", va, vb, "the first", "the second"), nil
}

// EqualJSON reports whether a and b are the same JSON value (DiffJSON).
func EqualJSON(a, b []byte) (bool, error) {
	d, err := DiffJSON(a, b)
	return d == "" && err == nil, err
}

// jsonNumber is a JSON number: its literal and its exact decimal value in
// a canonical form (sign, significant digits, exponent), equal for equal
// values.
type jsonNumber struct{ literal, exact string }

// parseJSON reads one JSON value into nil, bool, string, jsonNumber,
// []any and map[string]any. encoding/json checks the syntax (and limits
// nesting); the walk refuses member names given twice.
func parseJSON(data []byte) (any, error) {
	if !utf8.Valid(data) {
		return nil, errors.New("not UTF-8")
	}
	if !json.Valid(data) {
		return nil, errors.New("not one JSON value")
	}
	if err := loneSurrogate(data); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return readJSON(dec)
}

func readJSON(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		if t == '[' {
			return readArray(dec)
		}
		return readObject(dec)
	case json.Number:
		exact, err := exactDecimal(string(t))
		return jsonNumber{literal: string(t), exact: exact}, err
	default: // nil, bool, string
		return t, nil
	}
}

func readArray(dec *json.Decoder) (any, error) {
	arr := []any{}
	for dec.More() {
		v, err := readJSON(dec)
		if err != nil {
			return nil, err
		}
		arr = append(arr, v)
	}
	_, err := dec.Token() // ]
	return arr, err
}

func readObject(dec *json.Decoder) (any, error) {
	obj := map[string]any{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		name, _ := tok.(string)
		if _, dup := obj[name]; dup {
			return nil, fmt.Errorf("member name %s appears twice in an object", strconv.Quote(name))
		}
		if obj[name], err = readJSON(dec); err != nil {
			return nil, err
		}
	}
	_, err := dec.Token() // }
	return obj, err
}

// exactDecimal returns the canonical form of a valid JSON number literal:
// "0" for zero (of either sign), else an optional "-", the significant
// digits without leading or trailing zeros, "e" and the exponent, so that
// two literals have the same form exactly when they have the same value.
// The exponent is computed with math/big: no literal overflows it.
func exactDecimal(lit string) (string, error) {
	s, neg := strings.CutPrefix(lit, "-")
	mant, exp, _ := strings.Cut(strings.ToLower(s), "e")
	intPart, frac, _ := strings.Cut(mant, ".")
	digits := strings.TrimLeft(intPart+frac, "0")
	if digits == "" {
		return "0", nil
	}
	e := new(big.Int)
	if exp != "" {
		if _, ok := e.SetString(strings.TrimPrefix(exp, "+"), 10); !ok {
			return "", fmt.Errorf("number %s: bad exponent", lit)
		}
	}
	trimmed := strings.TrimRight(digits, "0")
	e.Add(e, big.NewInt(int64(len(digits)-len(trimmed)-len(frac))))
	sign := ""
	if neg {
		sign = "-"
	}
	return sign + trimmed + "e" + e.String(), nil
}

// diffJSON describes the first difference of a and b at path, "" if
// none; an and bn name the two sides in the description.
func diffJSON(path string, a, b any, an, bn string) string {
	differ := func() string {
		return fmt.Sprintf("at %s: %s in %s, %s in %s", path, describeJSON(a), an, describeJSON(b), bn)
	}
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok {
			return differ()
		}
		names := make([]string, 0, len(x)+len(y))
		for k := range x {
			names = append(names, k)
		}
		for k := range y {
			if _, ok := x[k]; !ok {
				names = append(names, k)
			}
		}
		slices.Sort(names)
		for _, k := range names {
			va, ina := x[k]
			vb, inb := y[k]
			p := memberPath(path, k)
			switch {
			case !ina:
				return fmt.Sprintf("at %s: absent in %s, %s in %s", p, an, describeJSON(vb), bn)
			case !inb:
				return fmt.Sprintf("at %s: %s in %s, absent in %s", p, describeJSON(va), an, bn)
			}
			if d := diffJSON(p, va, vb, an, bn); d != "" {
				return d
			}
		}
		return ""
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return differ()
		}
		for i := range x {
			if d := diffJSON(path+"["+strconv.Itoa(i)+"]", x[i], y[i], an, bn); d != "" {
				return d
			}
		}
		return ""
	case jsonNumber:
		if y, ok := b.(jsonNumber); ok && x.exact == y.exact {
			return ""
		}
		return differ()
	default: // nil, bool, string: comparable
		if a == b {
			return ""
		}
		return differ()
	}
}

// memberPath appends member name to a JSONPath-like path: .name for a
// plain identifier, ["name"] otherwise.
func memberPath(path, name string) string {
	plain := name != ""
	for i, c := range name {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9') {
			plain = false
			break
		}
	}
	if plain {
		return path + "." + name
	}
	return path + "[" + strconv.Quote(name) + "]"
}

// describeJSON names a parsed value in an error message: scalars as JSON
// (numbers as written; long strings cut), containers by their size.
func describeJSON(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case bool:
		return strconv.FormatBool(x)
	case jsonNumber:
		return x.literal
	case string:
		if r := []rune(x); len(r) > 40 {
			x = string(r[:40]) + "…"
		}
		return strconv.Quote(x)
	case []any:
		return fmt.Sprintf("an array of %d", len(x))
	case map[string]any:
		return fmt.Sprintf("an object of %d members", len(x))
	}
	return fmt.Sprintf("%v", v)
}

// loneSurrogate refuses a string escape of half a UTF-16 surrogate pair
// (I-JSON, RFC 7493 §2.1): encoding/json reads each as U+FFFD, so two
// strings that differ in them would compare equal. data is valid JSON, so
// a backslash is always an escape inside a string.
func loneSurrogate(data []byte) error {
	unit := func(i int) (uint64, bool) {
		if i+6 > len(data) || data[i] != '\\' || data[i+1] != 'u' {
			return 0, false
		}
		u, err := strconv.ParseUint(string(data[i+2:i+6]), 16, 16)
		return u, err == nil
	}
	for i := 0; i < len(data); i++ {
		if data[i] != '\\' {
			continue
		}
		u, ok := unit(i)
		switch {
		case !ok:
			i++ // a two-character escape
		case u >= 0xDC00 && u <= 0xDFFF:
			return fmt.Errorf("a lone surrogate escape \\u%04x", u)
		case u >= 0xD800 && u <= 0xDBFF:
			if lo, ok := unit(i + 6); !ok || lo < 0xDC00 || lo > 0xDFFF {
				return fmt.Errorf("a lone surrogate escape \\u%04x", u)
			}
			i += 11
		default:
			i += 5
		}
	}
	return nil
}
