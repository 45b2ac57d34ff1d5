package client

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/gowebpki/jcs"
)

// Limits of idempotency keys (SPEC §1).
const (
	MinKeyLen = 8
	MaxKeyLen = 255
)

// canonical returns the RFC 8785 (JCS) form of input: a json.RawMessage
// is taken as JSON text, anything else is marshalled with encoding/json
// first.
func canonical(input any) ([]byte, error) {
	var raw []byte
	switch v := input.(type) {
	case json.RawMessage:
		raw = v
		if len(raw) == 0 {
			raw = []byte("null")
		}
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("encode input: %w", err)
		}
		raw = b
	}
	canon, err := jcs.Transform(raw)
	if err != nil {
		return nil, fmt.Errorf("canonicalize input: %w", err)
	}
	return canon, nil
}

// Fingerprint returns the ledger's fingerprint of an input: "sha256:" and
// the hex SHA-256 of its RFC 8785 canonical JSON, exactly what the server
// computes from a reserve's "input". Do sends it as input_hash, so the
// input itself never leaves the gateway.
func Fingerprint(input any) (string, error) {
	canon, err := canonical(input)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(canon)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// DerivedKeyPrefix starts every key DeriveKey makes.
const DerivedKeyPrefix = "dk_"

// DeriveKey returns a stable idempotency key for a call of tool with
// input, derived from what the call does rather than drawn at random, so
// that a repeat of the same call — a runtime retry, the model calling the
// tool again, another gateway replica — finds the first one's receipt:
//
//	key = "dk_" + hex(SHA-256(tool ‖ 0x00 ‖ JCS(input)))
//
// where JCS is RFC 8785 canonical JSON (member order, spacing and number
// spelling do not matter) and a nil input is null. The key is 67 bytes of
// visible ASCII, valid for any tool, and the same as the Python client's
// derive_key, so gateways in either language share keys.
//
// Use it only when the same tool and input mean the same effect. Where a
// caller may want the same call twice on purpose (two identical refunds),
// put what tells them apart into input, or supply Effect.Key.
func DeriveKey(tool string, input any) (string, error) {
	if tool == "" {
		return "", errors.New("derive key: empty tool")
	}
	canon, err := canonical(input)
	if err != nil {
		return "", fmt.Errorf("derive key: %w", err)
	}
	h := sha256.New()
	h.Write([]byte(tool))
	h.Write([]byte{0})
	h.Write(canon)
	return DerivedKeyPrefix + hex.EncodeToString(h.Sum(nil)), nil
}
