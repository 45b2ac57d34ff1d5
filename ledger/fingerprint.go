package ledger

import (
	"context"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
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
// fingerprint fp: fp itself inline, its keyed form in a committed
// namespace ("" stays "").
func (n *Namespace) StoredInputHash(ctx context.Context, fp string) (string, error) {
	if fp == "" || !n.committed() {
		return fp, nil
	}
	k, err := n.FingerprintKey(ctx)
	if err != nil {
		return "", err
	}
	return KeyedHash(k, fp), nil
}
