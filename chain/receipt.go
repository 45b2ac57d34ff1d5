// Package chain defines the receipt of the effect ledger, its canonical byte
// encoding and the SHA-256 hash chain that links receipts together
// (SPEC §2). It depends on the standard library only, so that anyone can
// audit a ledger with it.
package chain

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Prefix is the domain-separation prefix hashed in front of every link.
const Prefix = "effect-receipt-ledger/v1"

// HashSize is the size of a chain hash in bytes.
const HashSize = sha256.Size

// Hash is a chain hash: SHA-256 over Prefix, the previous hash and a body.
type Hash [HashSize]byte

// ZeroHash is hash(0), the prev_hash of the first receipt.
var ZeroHash Hash

// String returns the hash as lowercase hex.
func (h Hash) String() string { return hex.EncodeToString(h[:]) }

// ParseHash parses 64 hex digits into a Hash.
func ParseHash(s string) (Hash, error) {
	var h Hash
	if len(s) != 2*HashSize {
		return h, fmt.Errorf("parse hash: want %d hex digits, got %d", 2*HashSize, len(s))
	}
	if _, err := hex.Decode(h[:], []byte(s)); err != nil {
		return h, fmt.Errorf("parse hash: %w", err)
	}
	return h, nil
}

// HashFromBytes converts a stored 32-byte value into a Hash.
func HashFromBytes(b []byte) (Hash, error) {
	var h Hash
	if len(b) != HashSize {
		return h, fmt.Errorf("hash: want %d bytes, got %d", HashSize, len(b))
	}
	copy(h[:], b)
	return h, nil
}

// Receipt kinds.
const (
	KindReserve = "reserve"
	KindCommit  = "commit"
	KindReplay  = "replay"
	KindResolve = "resolve"
	// v1.3 (SPEC §2.1, §13): the gate's policy, a reserve held for a
	// person, that person's answer, and a reserve the policy refused.
	KindPolicy   = "policy"
	KindAsk      = "ask"
	KindApproval = "approval"
	KindDeny     = "deny"
	// v1.4: a rotation of the log's signing key (SPEC §9.2), an erasure
	// of payloads (§14), the end of an interrupted key by the actor of
	// its reserve from a downstream's answer (§15), and a prune of
	// archived receipt bodies (§16).
	KindKey       = "key"
	KindErase     = "erase"
	KindReconcile = "reconcile"
	KindPrune     = "prune"
)

// Kinds are the receipt kinds of this contract, in the order they came.
var Kinds = []string{KindReserve, KindCommit, KindReplay, KindResolve, KindReconcile, KindPolicy, KindAsk, KindApproval,
	KindDeny, KindKey, KindErase, KindPrune}

// KnownKind reports whether kind is one of Kinds.
func KnownKind(kind string) bool { return slices.Contains(Kinds, kind) }

// KindList names Kinds for a message: "reserve, commit, …, erase or prune".
func KindList() string {
	return strings.Join(Kinds[:len(Kinds)-1], ", ") + " or " + Kinds[len(Kinds)-1]
}

// Keyless reports whether receipts of kind name no idempotency key and fix
// nothing for any key: the namespace's policy, an erasure, a signing key,
// a prune.
func Keyless(kind string) bool {
	return kind == KindPolicy || kind == KindErase || kind == KindKey || kind == KindPrune
}

// Effect classes. EffectNone and EffectRead are not effects and never
// appear on a receipt.
const (
	EffectNone        = "none"
	EffectRead        = "read"
	EffectWrite       = "write"
	EffectDestructive = "destructive"
	EffectExternal    = "external"
)

// Outcomes of commit and resolve receipts.
const (
	OutcomeSucceeded = "succeeded"
	OutcomeFailed    = "failed"
	// OutcomeNotApplied (v1.3, SPEC §4.1): the effect applied nothing, so
	// the key may be reserved again.
	OutcomeNotApplied = "not_applied"
	// OutcomeApproved and OutcomeRejected (v1.3, SPEC §13) are the
	// outcomes of an approval receipt.
	OutcomeApproved = "approved"
	OutcomeRejected = "rejected"
)

// Receipt is one entry of the chain. Field order and types are those of
// SPEC §2; the order is the canonical order of Body.
type Receipt struct {
	Seq            uint64
	Kind           string
	IdempotencyKey string
	KeyGenerated   bool
	ExecutionID    string
	Attempt        uint64
	Tool           string
	Effect         string
	Idempotent     bool
	InputHash      string
	Outcome        string
	ExternalRef    string
	Result         string // compact JSON text, hashed as opaque bytes; empty if none
	ErrorCode      string
	ErrorMessage   string
	Retryable      bool
	LeaseExpiresAt uint64 // unix milliseconds
	RefSeq         uint64
	Actor          string
	Note           string
	RecordedAt     uint64 // unix milliseconds

	PrevHash Hash
	Hash     Hash

	// Malformed lists the fields whose stored value the receipt format
	// cannot carry (a negative, fractional or non-numeric number, a
	// boolean other than 0 and 1, a hash that is not 32 bytes, a NULL),
	// in canonical order; each such field holds its zero value here. No
	// ledger writes one: an edited file or a buggy writer does. A receipt
	// with a malformed field has no canonical body, so its hash cannot be
	// recomputed. Nil for every receipt a ledger wrote.
	Malformed []Malformed

	// Open holds the values of the receipt's committed payload fields
	// (SPEC §14), whose texts above are their commitments; nil for a
	// receipt read in its chain form. It is not hashed. Only answers carry
	// it: a receipt with Open set is never cached.
	Open *Opening
}

// Malformed is a stored value that the receipt format cannot carry.
type Malformed struct {
	Field string // the field's name in SPEC §2, e.g. "attempt" or "prev_hash"
	Value string // the stored value as an SQL literal: 'abc', -1, 1.5, X'01ff', NULL
}

// IsMalformed reports whether the named field is listed in r.Malformed.
func (r *Receipt) IsMalformed(field string) bool {
	for i := range r.Malformed {
		if r.Malformed[i].Field == field {
			return true
		}
	}
	return false
}

// BodySize returns the length in bytes of the canonical body of r.
func (r *Receipt) BodySize() int {
	const fixed = 5*8 + 3*1 // five u64 fields, three bools
	n := fixed
	for _, s := range r.strings() {
		n += 4 + len(s)
	}
	return n
}

func (r *Receipt) strings() [13]string {
	return [13]string{r.Kind, r.IdempotencyKey, r.ExecutionID, r.Tool, r.Effect,
		r.InputHash, r.Outcome, r.ExternalRef, r.Result, r.ErrorCode, r.ErrorMessage,
		r.Actor, r.Note}
}

// AppendBody appends the canonical body of r to b and returns the result:
// the fields in canonical order, u64 as 8 bytes big-endian, bool as one
// byte 0x00/0x01, str as a 4-byte big-endian length and its bytes.
func (r *Receipt) AppendBody(b []byte) []byte {
	b = appendU64(b, r.Seq)
	b = appendStr(b, r.Kind)
	b = appendStr(b, r.IdempotencyKey)
	b = appendBool(b, r.KeyGenerated)
	b = appendStr(b, r.ExecutionID)
	b = appendU64(b, r.Attempt)
	b = appendStr(b, r.Tool)
	b = appendStr(b, r.Effect)
	b = appendBool(b, r.Idempotent)
	b = appendStr(b, r.InputHash)
	b = appendStr(b, r.Outcome)
	b = appendStr(b, r.ExternalRef)
	b = appendStr(b, r.Result)
	b = appendStr(b, r.ErrorCode)
	b = appendStr(b, r.ErrorMessage)
	b = appendBool(b, r.Retryable)
	b = appendU64(b, r.LeaseExpiresAt)
	b = appendU64(b, r.RefSeq)
	b = appendStr(b, r.Actor)
	b = appendStr(b, r.Note)
	b = appendU64(b, r.RecordedAt)
	return b
}

// Body returns the canonical body of r.
func (r *Receipt) Body() []byte {
	return r.AppendBody(make([]byte, 0, r.BodySize()))
}

// ComputeHash returns SHA-256(Prefix ‖ prev ‖ body(r)). It ignores the
// PrevHash, Hash and Malformed fields of r.
func (r *Receipt) ComputeHash(prev Hash) Hash {
	var h Hasher
	return h.Hash(prev, r)
}

// Hasher computes chain hashes reusing one buffer, so that hashing a long
// chain does not allocate per receipt. It is not safe for concurrent use.
type Hasher struct{ buf []byte }

// Hash returns SHA-256(Prefix ‖ prev ‖ body(r)), like Receipt.ComputeHash.
func (h *Hasher) Hash(prev Hash, r *Receipt) Hash {
	b := append(h.buf[:0], Prefix...)
	b = append(b, prev[:]...)
	b = r.AppendBody(b)
	h.buf = b
	return sha256.Sum256(b)
}

// Link returns r with Seq set to prev's successor, PrevHash set to prevHash
// and Hash computed. It is the only way the ledger builds a link.
func Link(prevSeq uint64, prevHash Hash, r Receipt) Receipt {
	r.Seq = prevSeq + 1
	r.PrevHash = prevHash
	r.Hash = r.ComputeHash(prevHash)
	return r
}

// ErrHashMismatch is the parent of every HashMismatchError.
var ErrHashMismatch = errors.New("hash mismatch")

// HashMismatchError reports a receipt whose stored hash differs from the
// hash computed from its fields.
type HashMismatchError struct {
	Seq      uint64
	Claimed  Hash
	Computed Hash
}

func (e *HashMismatchError) Error() string {
	return fmt.Sprintf("receipt %d: stored hash %s, computed %s", e.Seq, e.Claimed, e.Computed)
}

// Unwrap returns ErrHashMismatch.
func (e *HashMismatchError) Unwrap() error { return ErrHashMismatch }

// Check recomputes r's hash from its PrevHash and fields and returns a
// *HashMismatchError if it differs from r.Hash.
func (r *Receipt) Check() error {
	if got := r.ComputeHash(r.PrevHash); got != r.Hash {
		return &HashMismatchError{Seq: r.Seq, Claimed: r.Hash, Computed: got}
	}
	return nil
}

func appendU64(b []byte, v uint64) []byte { return binary.BigEndian.AppendUint64(b, v) }

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 1)
	}
	return append(b, 0)
}

func appendStr(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}
