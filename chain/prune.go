package chain

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// PruneResult is the result of a prune receipt (SPEC §16): the range of
// receipts whose bodies were archived and pruned, the digest of their
// segment, and the policy in force at Through+1, kept here so that the
// gate and the verifier still have it once its own receipt is pruned.
type PruneResult struct {
	From    uint64      `json:"from"`
	Through uint64      `json:"through"`
	Digest  string      `json:"digest"`
	Policy  PrunePolicy `json:"policy"`
}

// PrunePolicy is a policy receipt's seq and text (0 and "" for none).
type PrunePolicy struct {
	Seq  uint64 `json:"seq"`
	Text string `json:"text"`
}

// ErrPruneResult is the parent of every prune result parse error.
var ErrPruneResult = errors.New("malformed prune result")

// Text returns the result in RFC 8785 form (members sorted by name).
func (p *PruneResult) Text() string {
	b := []byte(`{"digest":`)
	b = AppendJSONString(b, p.Digest)
	b = append(b, `,"from":`...)
	b = strconv.AppendUint(b, p.From, 10)
	b = append(b, `,"policy":{"seq":`...)
	b = strconv.AppendUint(b, p.Policy.Seq, 10)
	b = append(b, `,"text":`...)
	b = AppendJSONString(b, p.Policy.Text)
	b = append(b, `},"through":`...)
	b = strconv.AppendUint(b, p.Through, 10)
	return string(append(b, '}'))
}

// ParsePruneResult parses a prune receipt's result: exactly the members
// of PruneResult, 1 ≤ from ≤ through, digest "sha256:" and 64 lowercase
// hex, a policy seq ≤ through+1 with a text only when it is not 0, the
// text in RFC 8785 form.
func ParsePruneResult(text string) (*PruneResult, error) {
	var p PruneResult
	dec := json.NewDecoder(strings.NewReader(text))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPruneResult, err)
	}
	switch {
	case p.From == 0 || p.Through < p.From:
		return nil, fmt.Errorf("%w: from %d and through %d are not a range of receipts", ErrPruneResult, p.From, p.Through)
	case len(p.Digest) != len("sha256:")+64 || !strings.HasPrefix(p.Digest, "sha256:") || !isLowerHex(p.Digest[7:]):
		return nil, fmt.Errorf("%w: digest is not sha256: and 64 lowercase hex digits", ErrPruneResult)
	case p.Policy.Seq > p.Through+1 || (p.Policy.Seq == 0) != (p.Policy.Text == ""):
		return nil, fmt.Errorf("%w: policy %d is not one in force at %d with its text", ErrPruneResult, p.Policy.Seq, p.Through+1)
	case p.Text() != text:
		return nil, fmt.Errorf("%w: not in RFC 8785 form", ErrPruneResult)
	}
	return &p, nil
}
