package ledger

import (
	"context"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"unicode/utf8"
)

// Keyed fingerprints (SPEC §14). In a committed namespace a request's
// input_hash is stored as KeyedHashPrefix + hex HMAC-SHA-256(the
// namespace's fingerprint key, the sha256: fingerprint of §4), so that
// dedupe, fingerprint_changed and the audit still work while a reader of
// the chain cannot confirm a guessed input. Callers send sha256: (or the
// input); the ledger keys it. The same key derives the clients' dk2_ keys.

// KeyedHashPrefix starts a keyed fingerprint.
const KeyedHashPrefix = "hk1:"

// fingerprintKeyInfo is the HKDF info of FingerprintKey.
const fingerprintKeyInfo = "effect-ledger fingerprint key"

// FingerprintKey derives a namespace's fingerprint key from its secret
// (Chain.StateKey): HKDF-SHA256 with no salt and info "effect-ledger
// fingerprint key".
func FingerprintKey(secret []byte) ([]byte, error) {
	if len(secret) < StateKeyLen {
		return nil, fmt.Errorf("fingerprint key: a secret of %d bytes, want %d", len(secret), StateKeyLen)
	}
	return hkdf.Key(sha256.New, secret, nil, fingerprintKeyInfo, StateKeyLen)
}

// KeyedHash is the keyed form of the fingerprint fp ("sha256:…").
func KeyedHash(key []byte, fp string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(fp))
	return KeyedHashPrefix + hex.EncodeToString(m.Sum(nil))
}

// FingerprintKey returns the namespace's fingerprint key.
func (n *Namespace) FingerprintKey(ctx context.Context) ([]byte, error) {
	if k := n.fpKey.Load(); k != nil {
		return *k, nil
	}
	secret, err := n.StateKey(ctx)
	if err != nil {
		return nil, err
	}
	k, err := FingerprintKey(secret)
	if err != nil {
		return nil, err
	}
	n.fpKey.Store(&k)
	return k, nil
}

// StoredInputHash is the input_hash the namespace records for the
// fingerprint fp of a new key: fp itself inline, its keyed form in a
// committed namespace (as last known: Payloads) ("" stays "").
func (n *Namespace) StoredInputHash(ctx context.Context, fp string) (string, error) {
	if fp == "" || n.Payloads() != PayloadsCommitted {
		return fp, nil
	}
	k, err := n.FingerprintKey(ctx)
	if err != nil {
		return "", err
	}
	return KeyedHash(k, fp), nil
}

// Subjects of a reserve (SPEC §14): opaque ids of the people an effect
// concerns, fixed by the first reserve of a key's generation, kept only as
// their MACs in a side index and deleted when the subject is erased.
const (
	MaxSubjects   = 8
	MaxSubjectLen = 128
)

// CheckSubjects validates a reserve's subjects: at most MaxSubjects
// strings of 1–MaxSubjectLen bytes of UTF-8. The message names the index,
// never the text.
func CheckSubjects(subjects []string) error {
	if len(subjects) > MaxSubjects {
		return Invalid("subjects", "subjects: at most %d", MaxSubjects)
	}
	for i, s := range subjects {
		if len(s) == 0 || len(s) > MaxSubjectLen || !utf8.ValidString(s) {
			return Invalid("subjects", "subjects[%d] must be 1–%d bytes of UTF-8", i, MaxSubjectLen)
		}
	}
	return nil
}

// SubjectMACOf is the MAC of subject under the fingerprint key.
func SubjectMACOf(key []byte, subject string) SubjectMAC {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(subject))
	var out SubjectMAC
	copy(out[:], m.Sum(nil))
	return out
}

// subjectMACs are the MACs of a request's subjects, in the namespace's key.
func (n *Namespace) subjectMACs(ctx context.Context, subjects []string) ([]SubjectMAC, error) {
	if len(subjects) == 0 {
		return nil, nil
	}
	k, err := n.FingerprintKey(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]SubjectMAC, 0, len(subjects))
	for _, s := range subjects {
		out = append(out, SubjectMACOf(k, s))
	}
	return out, nil
}
