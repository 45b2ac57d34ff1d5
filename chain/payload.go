package chain

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// Payloads that can be erased (SPEC §14). In a namespace (or part of one)
// whose payload mode is committed, the four payload fields of a receipt
// hold, when not empty, a salted commitment to their value instead of the
// value. The chain hashes the commitment text, so the chain and its
// recomputation from the receipts table do not change; the values and
// their salts live beside the chain, where they can be deleted.

// PayloadField is a payload field, by its number in the canonical body
// (SPEC §2).
type PayloadField uint8

// The four payload fields.
const (
	FieldExternalRef  PayloadField = 12
	FieldResult       PayloadField = 13
	FieldErrorMessage PayloadField = 15
	FieldNote         PayloadField = 20
)

// PayloadFields lists the payload fields in canonical order.
var PayloadFields = [4]PayloadField{FieldExternalRef, FieldResult, FieldErrorMessage, FieldNote}

var payloadNames = [4]string{"external_ref", "result", "error_message", "note"}

// index is f's place in PayloadFields, or -1.
func (f PayloadField) index() int {
	switch f {
	case FieldExternalRef:
		return 0
	case FieldResult:
		return 1
	case FieldErrorMessage:
		return 2
	case FieldNote:
		return 3
	}
	return -1
}

// Name is the field's name in SPEC §2 ("" for a field that is not a
// payload field).
func (f PayloadField) Name() string {
	if i := f.index(); i >= 0 {
		return payloadNames[i]
	}
	return ""
}

// ParsePayloadField returns the payload field named name.
func ParsePayloadField(name string) (PayloadField, bool) {
	for i, n := range payloadNames {
		if n == name {
			return PayloadFields[i], true
		}
	}
	return 0, false
}

// FieldSet is a set of payload fields.
type FieldSet uint8

// AllFields holds the four payload fields.
const AllFields FieldSet = 0xF

// Has reports whether f is in s.
func (s FieldSet) Has(f PayloadField) bool {
	i := f.index()
	return i >= 0 && s&(1<<i) != 0
}

// With returns s with f added.
func (s FieldSet) With(f PayloadField) FieldSet {
	if i := f.index(); i >= 0 {
		return s | 1<<i
	}
	return s
}

// Names lists the fields of s by name, in canonical order.
func (s FieldSet) Names() []string {
	var out []string
	for _, f := range PayloadFields {
		if s.Has(f) {
			out = append(out, f.Name())
		}
	}
	return out
}

// ParseFieldSet returns the set of the named fields; an unknown name is an
// error, and no names is AllFields.
func ParseFieldSet(names []string) (FieldSet, error) {
	if len(names) == 0 {
		return AllFields, nil
	}
	var s FieldSet
	for _, n := range names {
		f, ok := ParsePayloadField(n)
		if !ok {
			return 0, fmt.Errorf("%q is not a payload field (external_ref, result, error_message, note)", n)
		}
		s = s.With(f)
	}
	return s, nil
}

// Commitment text: CommitmentPrefix and 64 lowercase hex digits of
// SHA-256(PayloadDomain ‖ byte(field number) ‖ salt ‖ value).
const (
	CommitmentPrefix = "pc1:"
	PayloadDomain    = "effect-receipt-ledger/payload/v1"
)

// SaltSize is the size of a payload salt in bytes.
const SaltSize = 16

// Salt is a payload field's salt: fresh random bytes for each field of
// each receipt.
type Salt [SaltSize]byte

// String returns the salt as lowercase hex.
func (s Salt) String() string { return hex.EncodeToString(s[:]) }

// NewSalt draws a salt from the system's CSPRNG.
func NewSalt() Salt {
	var s Salt
	_, _ = rand.Read(s[:]) // crypto/rand.Read never fails (it crashes the program instead)
	return s
}

// ParseSalt parses 32 hex digits into a Salt.
func ParseSalt(text string) (Salt, error) {
	var s Salt
	if len(text) != 2*SaltSize {
		return s, fmt.Errorf("salt: want %d hex digits, got %d", 2*SaltSize, len(text))
	}
	if _, err := hex.Decode(s[:], []byte(text)); err != nil {
		return s, fmt.Errorf("salt: %w", err)
	}
	return s, nil
}

// SaltFromBytes converts a stored 16-byte value into a Salt.
func SaltFromBytes(b []byte) (Salt, error) {
	var s Salt
	if len(b) != SaltSize {
		return s, fmt.Errorf("salt: want %d bytes, got %d", SaltSize, len(b))
	}
	copy(s[:], b)
	return s, nil
}

// Commit returns the commitment text of value in field f with salt.
func Commit(f PayloadField, salt Salt, value string) string {
	h := sha256.New()
	h.Write([]byte(PayloadDomain))
	h.Write([]byte{byte(f)})
	h.Write(salt[:])
	h.Write([]byte(value))
	var sum [sha256.Size]byte
	b := make([]byte, 0, len(CommitmentPrefix)+2*sha256.Size)
	b = append(b, CommitmentPrefix...)
	return string(hex.AppendEncode(b, h.Sum(sum[:0])))
}

// IsCommitment reports whether s has the form of a commitment:
// CommitmentPrefix and exactly 64 lowercase hex digits.
func IsCommitment(s string) bool {
	if len(s) != len(CommitmentPrefix)+2*sha256.Size || s[:len(CommitmentPrefix)] != CommitmentPrefix {
		return false
	}
	return isLowerHex(s[len(CommitmentPrefix):])
}

// Exempt reports whether field f of a receipt of kind stays inline in a
// committed namespace, because verifier rules read it: the result of
// policy, approval, erase, key (SPEC §9.2) and prune (SPEC §16) receipts,
// and the note of reserve receipts (SPEC §13's changed object).
func Exempt(kind string, f PayloadField) bool {
	switch f {
	case FieldResult:
		return kind == KindPolicy || kind == KindApproval || kind == KindErase || kind == KindKey || kind == KindPrune
	case FieldNote:
		return kind == KindReserve
	}
	return false
}

// Field returns the text of payload field f of r.
func (r *Receipt) Field(f PayloadField) string {
	switch f {
	case FieldExternalRef:
		return r.ExternalRef
	case FieldResult:
		return r.Result
	case FieldErrorMessage:
		return r.ErrorMessage
	case FieldNote:
		return r.Note
	}
	return ""
}

// SetField sets the text of payload field f of r.
func (r *Receipt) SetField(f PayloadField, v string) {
	switch f {
	case FieldExternalRef:
		r.ExternalRef = v
	case FieldResult:
		r.Result = v
	case FieldErrorMessage:
		r.ErrorMessage = v
	case FieldNote:
		r.Note = v
	}
}

// Payload is the opening of one committed field: its value and salt, or,
// once erased, the seq of the erase receipt that removed them.
type Payload struct {
	Value    string
	Salt     Salt
	ErasedBy uint64 // > 0: value and salt are gone
}

// Opening holds the openings of a receipt's committed fields, by place in
// PayloadFields; nil for a field that is empty on the chain, exempt, or
// inline.
type Opening [4]*Payload

// Get returns the opening of field f, or nil.
func (o *Opening) Get(f PayloadField) *Payload {
	if o == nil || f.index() < 0 {
		return nil
	}
	return o[f.index()]
}

// Set sets the opening of field f.
func (o *Opening) Set(f PayloadField, p *Payload) {
	if i := f.index(); i >= 0 {
		o[i] = p
	}
}

// Empty reports whether o holds no field.
func (o *Opening) Empty() bool {
	return o == nil || *o == Opening{}
}

// Erased returns the erased fields of o with the seq of the erase receipt
// of each, or nil when none is erased.
func (o *Opening) Erased() map[PayloadField]uint64 {
	var out map[PayloadField]uint64
	if o == nil {
		return nil
	}
	for i, p := range o {
		if p != nil && p.ErasedBy > 0 {
			if out == nil {
				out = make(map[PayloadField]uint64)
			}
			out[PayloadFields[i]] = p.ErasedBy
		}
	}
	return out
}

// CommitFields replaces each non-empty, non-exempt payload field of r by
// its commitment under a fresh salt, and returns the values with their
// salts. It draws the salts in one read of the system's CSPRNG.
func CommitFields(r *Receipt) Opening {
	var salts [4]Salt
	var o Opening
	need := false
	for _, f := range PayloadFields {
		if r.Field(f) != "" && !Exempt(r.Kind, f) {
			need = true
		}
	}
	if !need {
		return o
	}
	var buf [4 * SaltSize]byte
	_, _ = rand.Read(buf[:]) // crypto/rand.Read never fails (it crashes the program instead)
	for i := range salts {
		copy(salts[i][:], buf[i*SaltSize:])
	}
	for i, f := range PayloadFields {
		v := r.Field(f)
		if v == "" || Exempt(r.Kind, f) {
			continue
		}
		o[i] = &Payload{Value: v, Salt: salts[i]}
		r.SetField(f, Commit(f, salts[i], v))
	}
	return o
}

// PayloadFault is what Check finds wrong with one field's opening.
type PayloadFault struct {
	Field PayloadField
	Why   string // FaultMismatch or FaultUnexpected
}

// Faults found by Opening.Check.
const (
	// FaultMismatch: a value that does not match its commitment.
	FaultMismatch = "mismatch"
	// FaultUnexpected: a value for a field whose chain text is empty,
	// exempt, or not a commitment.
	FaultUnexpected = "unexpected"
)

// Check compares each present value of o with the chain text of r: a value
// must open the commitment in its field. Erased fields and absent ones are
// not checked here (whether an absence is allowed depends on the erase
// receipts, which the verifier reads).
func (o *Opening) Check(r *Receipt) []PayloadFault {
	if o == nil {
		return nil
	}
	var out []PayloadFault
	for i, p := range o {
		if p == nil || p.ErasedBy > 0 {
			continue
		}
		f := PayloadFields[i]
		text := r.Field(f)
		switch {
		case !IsCommitment(text) || Exempt(r.Kind, f):
			out = append(out, PayloadFault{Field: f, Why: FaultUnexpected})
		case Commit(f, p.Salt, p.Value) != text:
			out = append(out, PayloadFault{Field: f, Why: FaultMismatch})
		}
	}
	return out
}
