package client

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

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

// DeriveKey returns a stable idempotency key for a call of tool with
// input, derived from what the call does rather than drawn at random, so
// that a repeat of the same call — a runtime retry, the model calling the
// tool again, another gateway replica — finds the first one's receipt:
//
//	key = T + ":" + hex(SHA-256(JCS({"input": input, "tool": tool})))
//
// where JCS is RFC 8785 canonical JSON (member order and number and
// string forms do not matter) and T is tool with every byte outside
// 0x21–0x7E replaced by '_', cut to 190 bytes, and with a leading '_'
// when it starts with the reserved "gen_". The key is at most 255 bytes
// of 0x21–0x7E, as the ledger requires.
//
// Use it only when the same tool and input mean the same effect. Where a
// caller may want the same call twice on purpose (two identical refunds),
// put what tells them apart into input, or supply Effect.Key.
func DeriveKey(tool string, input any) (string, error) {
	if tool == "" {
		return "", errors.New("derive key: empty tool")
	}
	canonIn, err := canonical(input)
	if err != nil {
		return "", fmt.Errorf("derive key: %w", err)
	}
	toolJSON, err := json.Marshal(tool)
	if err != nil {
		return "", fmt.Errorf("derive key: %w", err)
	}
	obj := make([]byte, 0, len(canonIn)+len(toolJSON)+20)
	obj = append(obj, `{"input":`...)
	obj = append(obj, canonIn...)
	obj = append(obj, `,"tool":`...)
	obj = append(obj, toolJSON...)
	obj = append(obj, '}')
	canon, err := jcs.Transform(obj)
	if err != nil {
		return "", fmt.Errorf("derive key: %w", err)
	}
	sum := sha256.Sum256(canon)
	return keyPrefix(tool) + ":" + hex.EncodeToString(sum[:]), nil
}

// keyPrefix makes tool safe as the readable part of a derived key.
func keyPrefix(tool string) string {
	b := []byte(tool)
	for i, c := range b {
		if c < 0x21 || c > 0x7E {
			b[i] = '_'
		}
	}
	const max = MaxKeyLen - 1 - sha256.Size*2 - 1 // room for ":", the hash and a leading '_'
	if len(b) > max {
		b = b[:max]
	}
	p := string(b)
	if strings.HasPrefix(p, generatedPrefix) {
		p = "_" + p
	}
	return p
}

// generatedPrefix starts the keys the ledger generates; supplied keys may
// not use it.
const generatedPrefix = "gen_"
