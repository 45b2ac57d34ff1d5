package tlog

import (
	"encoding/json"
	"fmt"

	"github.com/effect-ledger/effect-ledger/chain"
)

// ErasureProof is a portable receipt's "erased_by" (SPEC §14): the erase
// receipt that erased fields of the receipt, in the same portable form
// (the chain's text), its inclusion proof under the bundle's checkpoint,
// and the opening of its set: the erased ranges of seqs and their salt, so
// that SetDigest(salt, ranges) is the erase receipt's result.set. The
// ranges name every receipt erased with this one.
type ErasureProof struct {
	Receipt   chain.Receipt `json:"receipt"`
	Inclusion []HexHash     `json:"inclusion"`
	Ranges    []chain.Range `json:"ranges"`
	Salt      string        `json:"salt"`
}

// FieldErasedBy is the verdict of a field whose erasure the bundle proves:
// "erased by S".
const FieldErasedBy = "erased by"

// ErrErasureProof is the parent of errors about a portable receipt's
// erased_by: an erase receipt that is not included under the checkpoint,
// is not an erase, whose set the ranges and salt do not open, whose ranges
// do not hold the receipt, or that does not list a field said erased by it.
var ErrErasureProof = fmt.Errorf("%w: erase receipt", ErrProof)

var erasureProofFields = map[string]bool{"receipt": true, "inclusion": true, "ranges": true, "salt": true}

// parseErasedBy checks the exact form of an "erased_by" member: an object
// of exactly receipt (a receipt in its exact form), inclusion, ranges
// (sorted, disjoint [from, to] pairs of integer seqs ≥ 1) and salt.
func parseErasedBy(raw json.RawMessage) error {
	members, err := checkMembers(raw, erasureProofFields)
	if err != nil {
		return fmt.Errorf("erased_by: %w", err)
	}
	for name := range erasureProofFields {
		if _, ok := members[name]; !ok {
			return fmt.Errorf("%w: erased_by: no %s", ErrPortableForm, name)
		}
	}
	if _, err := checkMembers(members["receipt"], receiptFields); err != nil {
		return fmt.Errorf("erased_by: receipt: %w", err)
	}
	var pairs [][]json.RawMessage
	if err := json.Unmarshal(members["ranges"], &pairs); err != nil || pairs == nil {
		return fmt.Errorf("%w: erased_by: ranges is not an array of [from, to] pairs", ErrPortableForm)
	}
	rs := make([]chain.Range, len(pairs))
	for i, p := range pairs {
		if len(p) != 2 || json.Unmarshal(p[0], &rs[i][0]) != nil || json.Unmarshal(p[1], &rs[i][1]) != nil {
			return fmt.Errorf("%w: erased_by: ranges[%d] is not a pair of integer seqs", ErrPortableForm, i)
		}
	}
	if _, err := chain.ParseRanges(chain.RangesText(rs)); err != nil || len(rs) == 0 {
		return fmt.Errorf("%w: erased_by: ranges must be sorted, disjoint, non-empty runs of seqs ≥ 1", ErrPortableForm)
	}
	return nil
}

// checkErasedBy verifies p.ErasedBy against c, the checkpoint p's receipt
// was verified under, and returns the erase receipt's seq: the erase
// receipt hashes to its hash, is included in c, is of kind erase and after
// p's receipt, its set is SHA-256(salt ‖ JCS(ranges)), one range holds p's
// seq, and its fields list every field p's erased says it erased. Errors
// wrap ErrErasureProof, ErrReceiptHash or ErrProof.
func checkErasedBy(p *PortableReceipt, c Checkpoint) (uint64, error) {
	e := p.ErasedBy
	r := &e.Receipt
	seq := r.Seq
	var named []chain.PayloadField
	for _, f := range chain.PayloadFields {
		if by, ok := p.Erased[f.Name()]; ok && by == seq {
			named = append(named, f)
		}
	}
	switch {
	case p.Payloads == nil:
		return 0, fmt.Errorf("%w: erased_by in a receipt of an inline namespace", ErrErasureProof)
	case len(named) == 0:
		return 0, fmt.Errorf("%w: erased_by proves erase receipt %d, which erased names for no field", ErrErasureProof, seq)
	}
	if err := r.Check(); err != nil {
		return 0, fmt.Errorf("erased_by: %w: %w", ErrReceiptHash, err)
	}
	if r.Kind != chain.KindErase {
		return 0, fmt.Errorf("%w: erased_by holds a %s receipt (seq %d), not an erase receipt", ErrErasureProof, r.Kind, seq)
	}
	if seq <= p.Receipt.Seq {
		return 0, fmt.Errorf("%w: erase receipt %d is not after receipt %d", ErrErasureProof, seq, p.Receipt.Seq)
	}
	if err := CheckInclusion(fromHex(e.Inclusion), c.Size, c.Root, LeafIndex(seq), r.Hash); err != nil {
		return 0, fmt.Errorf("erase receipt %d: %w", seq, err)
	}
	res, fields, err := chain.ParseEraseResult(r.Result)
	if err != nil {
		return 0, fmt.Errorf("%w: %d: %w", ErrErasureProof, seq, err)
	}
	salt, err := chain.ParseSalt(e.Salt)
	if err != nil {
		return 0, fmt.Errorf("%w: %d: erased_by: %w", ErrErasureProof, seq, err)
	}
	if chain.SetDigest(salt, e.Ranges) != res.Set {
		return 0, fmt.Errorf("%w: %d: the ranges and salt do not open its set", ErrErasureProof, seq)
	}
	if len(e.Ranges) == 0 || e.Ranges[len(e.Ranges)-1][1] >= seq {
		return 0, fmt.Errorf("%w: %d: its ranges are not all below its own seq", ErrErasureProof, seq)
	}
	if !chain.RangesHold(e.Ranges, p.Receipt.Seq) {
		return 0, fmt.Errorf("%w: %d: receipt %d is in none of its ranges", ErrErasureProof, seq, p.Receipt.Seq)
	}
	for _, f := range named {
		if !fields.Has(f) {
			return 0, fmt.Errorf("%w: %d: its fields do not list %s", ErrErasureProof, seq, f.Name())
		}
	}
	return seq, nil
}
