package tlog

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"golang.org/x/mod/sumdb/note"

	"github.com/effect-ledger/effect-ledger/chain"
)

// CheckPortableKeys verifies a portable receipt with the verifier keys a
// holder trusts (any one suffices), following the key receipts the bundle
// carries (SPEC §9.2): each, in seq order, that retires a trusted key and
// is proven included in a checkpoint that key signed, adds the key it
// announces. The receipt's checkpoint must then carry a valid signature by
// a trusted key. It returns the verified checkpoint and the ids of the
// keys learnt.
func CheckPortableKeys(p *PortableReceipt, vs []note.Verifier, ns string) (Checkpoint, []string, error) {
	trusted := slices.Clone(vs)
	keys := slices.Clone(p.Keys)
	slices.SortFunc(keys, func(a, b PortableReceipt) int { return cmp.Compare(a.Receipt.Seq, b.Receipt.Seq) })
	var learnt []string
	for i := range keys {
		k := &keys[i]
		if k.Receipt.Kind != chain.KindKey {
			return Checkpoint{}, nil, fmt.Errorf("%w: keys holds a %s receipt (seq %d), not a key receipt", ErrPortableForm, k.Receipt.Kind, k.Receipt.Seq)
		}
		res, err := chain.ParseKeyResult(k.Receipt.Result)
		if err != nil {
			return Checkpoint{}, nil, fmt.Errorf("key receipt %d: %w", k.Receipt.Seq, err)
		}
		i := slices.IndexFunc(trusted, func(v note.Verifier) bool { return KeyID(v) == res.Retires })
		if i < 0 || slices.ContainsFunc(trusted, func(v note.Verifier) bool { return v.Name()+"+"+KeyID(v) == vkeyPrefix(res.VKey) }) {
			continue // it retires no key trusted here, or its key is trusted already
		}
		if _, err := CheckPortable(k, trusted[i], ns); err != nil {
			if errors.Is(err, ErrCheckpointSignature) {
				continue // not proven under the key it retires: it teaches nothing
			}
			return Checkpoint{}, nil, fmt.Errorf("key receipt %d: %w", k.Receipt.Seq, err)
		}
		nv, err := NewVerifier(res.VKey)
		if err != nil {
			return Checkpoint{}, nil, fmt.Errorf("key receipt %d: %w", k.Receipt.Seq, err)
		}
		trusted = append(trusted, nv)
		learnt = append(learnt, KeyID(nv))
	}
	c, err := CheckPortableAny(p, trusted, ns)
	return c, learnt, err
}

// vkeyPrefix is NAME+ID of a verifier key.
func vkeyPrefix(vkey string) string {
	name, id, _ := chain.ParseVerifierKey(vkey)
	return name + "+" + id
}

// CheckPortableAny is CheckPortable with several keys, any one of which
// suffices.
func CheckPortableAny(p *PortableReceipt, vs []note.Verifier, ns string) (Checkpoint, error) {
	if err := p.Receipt.Check(); err != nil {
		return Checkpoint{}, fmt.Errorf("%w: %w", ErrReceiptHash, err)
	}
	c, _, err := OpenCheckpointAny([]byte(p.Checkpoint), vs, ns)
	if err != nil {
		return c, err
	}
	if p.Receipt.Seq == 0 || p.LeafIndex != LeafIndex(p.Receipt.Seq) {
		return c, fmt.Errorf("%w: leaf_index %d does not belong to seq %d", ErrProof, p.LeafIndex, p.Receipt.Seq)
	}
	if err := CheckInclusion(fromHex(p.Inclusion), c.Size, c.Root, p.LeafIndex, p.Receipt.Hash); err != nil {
		return c, err
	}
	return c, nil
}
