package chain

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// An erase receipt (SPEC §14) says how many receipts' payloads it erased,
// which fields, and a salted digest of the erased ranges of seqs. The
// ranges and their salt are kept off the chain, so the public log does not
// say which receipts belonged to one person; whoever holds them can check
// them against the digest.

// Range is an inclusive run of seqs [From, To].
type Range [2]uint64

// Ranges returns the exact runs of the given seqs, sorted, without
// duplicates; no gap is bridged.
func Ranges(seqs []uint64) []Range {
	s := slices.Clone(seqs)
	slices.Sort(s)
	s = slices.Compact(s)
	var out []Range
	for _, q := range s {
		if n := len(out); n > 0 && out[n-1][1]+1 == q {
			out[n-1][1] = q
			continue
		}
		out = append(out, Range{q, q})
	}
	return out
}

// RangesCount is the number of seqs the ranges hold.
func RangesCount(rs []Range) uint64 {
	var n uint64
	for _, r := range rs {
		n += r[1] - r[0] + 1
	}
	return n
}

// RangesHold reports whether seq lies in one of the sorted ranges rs.
func RangesHold(rs []Range, seq uint64) bool {
	i, _ := slices.BinarySearchFunc(rs, seq, func(r Range, s uint64) int {
		switch {
		case r[1] < s:
			return -1
		case r[0] > s:
			return 1
		}
		return 0
	})
	return i < len(rs) && rs[i][0] <= seq && seq <= rs[i][1]
}

// RangesText is the RFC 8785 form of the ranges: [[from,to],…].
func RangesText(rs []Range) string {
	b := []byte{'['}
	for i, r := range rs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '[')
		b = strconv.AppendUint(b, r[0], 10)
		b = append(b, ',')
		b = strconv.AppendUint(b, r[1], 10)
		b = append(b, ']')
	}
	return string(append(b, ']'))
}

// ParseRanges parses the RFC 8785 form of ranges and checks it: each range
// has From ≤ To and lies above the previous one. It returns the ranges and
// whether text was exactly their RFC 8785 form.
func ParseRanges(text string) ([]Range, error) {
	var rs []Range
	if err := json.Unmarshal([]byte(text), &rs); err != nil {
		return nil, fmt.Errorf("ranges: %w", err)
	}
	for i, r := range rs {
		if r[0] == 0 || r[0] > r[1] || (i > 0 && rs[i-1][1] >= r[0]) {
			return nil, errors.New("ranges: not sorted, disjoint runs of seqs ≥ 1")
		}
	}
	if RangesText(rs) != text {
		return nil, errors.New("ranges: not in RFC 8785 form")
	}
	return rs, nil
}

// SetDigest is the set of an erase receipt: "sha256:" and the hex SHA-256
// of the salt followed by the RFC 8785 text of the ranges.
func SetDigest(salt Salt, rs []Range) string {
	h := sha256.New()
	h.Write(salt[:])
	h.Write([]byte(RangesText(rs)))
	var sum [sha256.Size]byte
	return "sha256:" + hex.EncodeToString(h.Sum(sum[:0]))
}

// EraseResult is the result of an erase receipt.
type EraseResult struct {
	Set       string   `json:"set"`
	Count     uint64   `json:"count"`
	Fields    []string `json:"fields"`
	Retention bool     `json:"retention,omitempty"`
}

// Text returns the result in RFC 8785 form (members sorted by name; fields
// in canonical order).
func (e *EraseResult) Text() string {
	b := []byte(`{"count":`)
	b = strconv.AppendUint(b, e.Count, 10)
	b = append(b, `,"fields":[`...)
	for i, f := range e.Fields {
		if i > 0 {
			b = append(b, ',')
		}
		b = AppendJSONString(b, f)
	}
	b = append(b, ']')
	if e.Retention {
		b = append(b, `,"retention":true`...)
	}
	b = append(b, `,"set":`...)
	b = AppendJSONString(b, e.Set)
	return string(append(b, '}'))
}

// ParseEraseResult parses an erase receipt's result: exactly the members
// of EraseResult, fields known payload field names in canonical order
// without repeats, set "sha256:" and 64 lowercase hex, the text in RFC 8785
// form.
func ParseEraseResult(text string) (*EraseResult, FieldSet, error) {
	var e EraseResult
	dec := json.NewDecoder(strings.NewReader(text))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		return nil, 0, fmt.Errorf("erase result: %w", err)
	}
	var set FieldSet
	for _, n := range e.Fields {
		f, ok := ParsePayloadField(n)
		if !ok {
			return nil, 0, fmt.Errorf("erase result: %q is not a payload field", n)
		}
		set = set.With(f)
	}
	if len(e.Fields) == 0 || !slices.Equal(set.Names(), e.Fields) {
		return nil, 0, errors.New("erase result: fields must be payload fields in canonical order")
	}
	if len(e.Set) != len("sha256:")+64 || e.Set[:7] != "sha256:" || !isLowerHex(e.Set[7:]) {
		return nil, 0, errors.New("erase result: set is not sha256: and 64 hex digits")
	}
	if e.Text() != text {
		return nil, 0, errors.New("erase result: not in RFC 8785 form")
	}
	return &e, set, nil
}

func isLowerHex(s string) bool {
	for _, c := range []byte(s) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
