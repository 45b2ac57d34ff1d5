package tlog

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/effect-ledger/effect-ledger/chain"
)

// Disclosed is the opening of one committed payload field in a portable
// receipt (SPEC §14): the value and the salt its commitment was made with.
type Disclosed struct {
	Value string `json:"value"`
	Salt  string `json:"salt"`
}

// Disclosures are a portable receipt's disclosed fields by name. A holder
// may drop an entry before handing the receipt on (selective disclosure).
type Disclosures map[string]Disclosed

// Field verdicts of a committed receipt's payload fields.
const (
	FieldDisclosed    = "disclosed"
	FieldNotDisclosed = "not disclosed"
)

// ErrDisclosure is the parent of errors about a portable receipt's
// payloads: a disclosed value that does not open its commitment, a plain
// value in a committed field, an opening of a field that has no
// commitment.
var ErrDisclosure = fmt.Errorf("%w: payload disclosure", ErrProof)

// parseDisclosures checks the exact form of a "payloads" member: an
// object of payload field names, each an object of exactly "value" and
// "salt".
func parseDisclosures(raw json.RawMessage) error {
	entries, err := checkMembers(raw, nil)
	if err != nil {
		return fmt.Errorf("payloads: %w", err)
	}
	for name, e := range entries {
		if _, ok := chain.ParsePayloadField(name); !ok {
			return fmt.Errorf("%w: payloads: %s is not a payload field", ErrPortableForm, strconv.Quote(name))
		}
		if _, err := checkMembers(e, disclosedFields); err != nil {
			return fmt.Errorf("payloads: %s: %w", name, err)
		}
		var d struct{ Value, Salt *string }
		if err := json.Unmarshal(e, &d); err != nil || d.Value == nil || d.Salt == nil {
			return fmt.Errorf("%w: payloads: %s needs a string value and salt", ErrPortableForm, name)
		}
	}
	return nil
}

var disclosedFields = map[string]bool{"value": true, "salt": true}

// CheckDisclosures checks the payload fields of a portable receipt, whose
// checkpoint c is verified, and returns each committed field's verdict
// (FieldDisclosed, FieldNotDisclosed, "erased by S" when the bundle's
// erased_by proves it, or "not disclosed (issuer says erased by S)"). In
// a committed receipt (p.Payloads set) a payload field that is neither
// empty, exempt nor a commitment is refused, and each disclosed value must
// open its field's commitment. Errors wrap ErrDisclosure, or, for
// erased_by, ErrErasureProof, ErrReceiptHash or ErrProof.
func CheckDisclosures(p *PortableReceipt, c Checkpoint) (map[string]string, error) {
	r := &p.Receipt
	var proven uint64
	if p.ErasedBy != nil {
		var err error
		if proven, err = checkErasedBy(p, c); err != nil {
			return nil, err
		}
	}
	var out map[string]string
	for _, f := range chain.PayloadFields {
		text, name := r.Field(f), f.Name()
		var d *Disclosed
		if p.Payloads != nil {
			if v, ok := (*p.Payloads)[name]; ok {
				d = &v
			}
		}
		committed := !chain.Exempt(r.Kind, f) && chain.IsCommitment(text)
		switch {
		case d != nil && !committed:
			return nil, fmt.Errorf("%w: %s is disclosed, but the receipt holds no commitment for it", ErrDisclosure, name)
		case p.Payloads != nil && text != "" && !chain.Exempt(r.Kind, f) && !committed:
			return nil, fmt.Errorf("%w: %s holds a plain value, not a commitment, in a committed receipt", ErrDisclosure, name)
		case !committed:
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		if d == nil {
			out[name] = notDisclosed(p.Erased, name, proven)
			continue
		}
		salt, err := chain.ParseSalt(d.Salt)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: salt: %w", ErrDisclosure, name, err)
		}
		if chain.Commit(f, salt, d.Value) != text {
			return nil, fmt.Errorf("%w: the disclosed %s does not open its commitment", ErrDisclosure, name)
		}
		out[name] = FieldDisclosed
	}
	return out, nil
}

// notDisclosed is the verdict of a committed field whose value the bundle
// does not open: erased by S when the bundle proves erase S, the issuer's
// word when it only names it.
func notDisclosed(erased map[string]uint64, name string, proven uint64) string {
	by, ok := erased[name]
	switch {
	case !ok:
		return FieldNotDisclosed
	case proven != 0 && by == proven:
		return fmt.Sprintf("%s %d", FieldErasedBy, by)
	}
	return fmt.Sprintf("%s (issuer says erased by %d)", FieldNotDisclosed, by)
}
