package tlog

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"golang.org/x/mod/sumdb/note"
	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/chain"
)

// HexHash is a Hash that encodes as lowercase hex in JSON.
type HexHash Hash

// MarshalJSON encodes h as a lowercase hex string.
func (h HexHash) MarshalJSON() ([]byte, error) { return json.Marshal(hex.EncodeToString(h[:])) }

// UnmarshalJSON decodes a 64-digit hex string.
func (h *HexHash) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	d, err := hex.DecodeString(s)
	if err != nil || len(d) != len(h) {
		return fmt.Errorf("hash %q is not 64 hex digits", s)
	}
	copy(h[:], d)
	return nil
}

// HexHashes converts hashes for JSON.
func HexHashes(hs []Hash) []HexHash {
	out := make([]HexHash, len(hs))
	for i, h := range hs {
		out[i] = HexHash(h)
	}
	return out
}

func fromHex(hs []HexHash) []Hash {
	out := make([]Hash, len(hs))
	for i, h := range hs {
		out[i] = Hash(h)
	}
	return out
}

// InclusionProof is the body of GET /v1/proof/inclusion.
type InclusionProof struct {
	Seq       uint64    `json:"seq"`
	LeafIndex int64     `json:"leaf_index"`
	TreeSize  int64     `json:"tree_size"`
	Root      HexHash   `json:"root"`
	Hashes    []HexHash `json:"hashes"`
}

// ConsistencyProof is the body of GET /v1/proof/consistency.
type ConsistencyProof struct {
	From     int64     `json:"from"`
	To       int64     `json:"to"`
	RootFrom HexHash   `json:"root_from"`
	RootTo   HexHash   `json:"root_to"`
	Hashes   []HexHash `json:"hashes"`
}

// PortableReceipt is a receipt with what proves it is in the log: the
// body of GET /v1/receipts/{seq}/proof.
type PortableReceipt struct {
	Receipt    chain.Receipt `json:"receipt"`
	LeafIndex  int64         `json:"leaf_index"`
	Inclusion  []HexHash     `json:"inclusion"`
	Checkpoint string        `json:"checkpoint"`
	// Payloads, in a committed namespace (SPEC §14), opens the disclosed
	// payload fields ({} when every one is withheld); nil for a receipt
	// of an inline namespace.
	Payloads *Disclosures `json:"payloads,omitempty"`
	// Erased names the fields the issuer erased, with the seq of the
	// erase receipt of each.
	Erased map[string]uint64 `json:"erased,omitempty"`
	// ErasedBy proves the erasure of the fields Erased names with its
	// seq: the erase receipt, its inclusion under Checkpoint and the
	// opening of its set. Only on request, by an admin: its ranges say
	// which receipts were erased together.
	ErasedBy *ErasureProof `json:"erased_by,omitempty"`
	// Keys are the namespace's key receipts (SPEC §9.2), each proven
	// under the first checkpoint that covers it (signed by the key it
	// retires), so that a verifier who trusts an older key can accept a
	// checkpoint signed by a later one.
	Keys []PortableReceipt `json:"keys,omitempty"`
}

// ProveInclusion returns the proof that leaf index is in the tree of size
// n whose hashes r reads.
func ProveInclusion(n, index int64, r sumdb.HashReader) ([]Hash, error) {
	p, err := sumdb.ProveRecord(n, index, r)
	if err != nil {
		return nil, fmt.Errorf("inclusion proof of leaf %d in tree %d: %w", index, n, err)
	}
	return p, nil
}

// ProveConsistency returns the proof that the tree of size m is a prefix
// of the tree of size n (empty when m is 0 or m equals n).
func ProveConsistency(n, m int64, r sumdb.HashReader) ([]Hash, error) {
	if m == 0 || m == n {
		return []Hash{}, nil
	}
	p, err := sumdb.ProveTree(n, m, r)
	if err != nil {
		return nil, fmt.Errorf("consistency proof %d→%d: %w", m, n, err)
	}
	return p, nil
}

// ErrProof is the parent of every proof that does not verify.
var ErrProof = errors.New("proof does not verify")

// CheckInclusion verifies that the receipt hash is leaf index of the tree
// of size n with root.
func CheckInclusion(proof []Hash, n int64, root Hash, index int64, receiptHash chain.Hash) error {
	if index < 0 || index >= n {
		return fmt.Errorf("%w: leaf %d is outside the tree of size %d", ErrProof, index, n)
	}
	if err := sumdb.CheckRecord(proof, n, root, index, LeafHash(receiptHash)); err != nil {
		return fmt.Errorf("%w: inclusion of leaf %d in tree %d: %w", ErrProof, index, n, err)
	}
	return nil
}

// CheckConsistency verifies that the tree (m, rootM) is a prefix of the
// tree (n, rootN).
func CheckConsistency(proof []Hash, n int64, rootN Hash, m int64, rootM Hash) error {
	switch {
	case m < 0 || m > n:
		return fmt.Errorf("%w: size %d cannot be a prefix of size %d", ErrProof, m, n)
	case m == 0:
		if len(proof) != 0 {
			return fmt.Errorf("%w: a proof from the empty tree must be empty", ErrProof)
		}
		return nil
	case m == n:
		if len(proof) != 0 || rootM != rootN {
			return fmt.Errorf("%w: two different roots at size %d", ErrProof, n)
		}
		return nil
	}
	if err := sumdb.CheckTree(proof, n, rootN, m, rootM); err != nil {
		return fmt.Errorf("%w: consistency %d→%d: %w", ErrProof, m, n, err)
	}
	return nil
}

// ErrReceiptHash means a portable receipt's fields do not hash to its hash.
var ErrReceiptHash = errors.New("the receipt's fields do not hash to its hash")

// CheckPortable verifies a portable receipt with nothing but the log's
// verifier key: the receipt's hash recomputed from its fields (SPEC §2),
// the checkpoint's signature and origin (that of namespace ns; any
// namespace of the key when ns is empty), and the inclusion of the hash
// in the signed tree. It returns the verified checkpoint.
func CheckPortable(p *PortableReceipt, v note.Verifier, ns string) (Checkpoint, error) {
	if err := p.Receipt.Check(); err != nil {
		return Checkpoint{}, fmt.Errorf("%w: %w", ErrReceiptHash, err)
	}
	c, err := OpenCheckpoint([]byte(p.Checkpoint), v, ns)
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

// FromHex converts JSON hashes back.
func FromHex(hs []HexHash) []Hash { return fromHex(hs) }
