package chain

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// A key receipt (SPEC §9.2) announces on the chain the verifier key that
// signs the log's checkpoints from now on, and the id of the key it
// retires. A signed note names its signers only by name and key id, so a
// verifier learns the new public key from this receipt, proven included in
// a checkpoint signed by the key it retires.

// KeyResult is the result of a key receipt.
type KeyResult struct {
	// VKey is the new verifier key, NAME+ID+BASE64 (the
	// golang.org/x/mod/sumdb/note form).
	VKey string `json:"vkey"`
	// Retires is the key id (8 lowercase hex digits) of the key it
	// replaces.
	Retires string `json:"retires"`
}

// Text returns the result in RFC 8785 form: {"retires":…,"vkey":…}.
func (k *KeyResult) Text() string {
	b := []byte(`{"retires":`)
	b = AppendJSONString(b, k.Retires)
	b = append(b, `,"vkey":`...)
	b = AppendJSONString(b, k.VKey)
	return string(append(b, '}'))
}

// ErrKeyResult is the parent of the errors about a key receipt's result.
var ErrKeyResult = errors.New("malformed key result")

// ParseKeyResult parses a key receipt's result: exactly the members of
// KeyResult, a well-formed Ed25519 verifier key, retires a key id other
// than the new key's, the text in RFC 8785 form.
func ParseKeyResult(text string) (*KeyResult, error) {
	var k KeyResult
	dec := json.NewDecoder(strings.NewReader(text))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&k); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrKeyResult, err)
	}
	if _, _, err := ParseVerifierKey(k.VKey); err != nil {
		return nil, fmt.Errorf("%w: vkey: %w", ErrKeyResult, err)
	}
	if !ValidKeyID(k.Retires) {
		return nil, fmt.Errorf("%w: retires %q is not a key id (8 lowercase hex digits)", ErrKeyResult, k.Retires)
	}
	if _, id, _ := ParseVerifierKey(k.VKey); id == k.Retires {
		return nil, fmt.Errorf("%w: the new key retires itself", ErrKeyResult)
	}
	if k.Text() != text {
		return nil, fmt.Errorf("%w: not in RFC 8785 form", ErrKeyResult)
	}
	return &k, nil
}

// ValidKeyID reports whether id is a key id: 8 lowercase hex digits.
func ValidKeyID(id string) bool { return len(id) == 8 && isLowerHex(id) }

// ParseVerifierKey checks an Ed25519 verifier key NAME+ID+BASE64(0x01 ‖
// 32-byte public key) — its name free of '+' and white space, its id the
// key hash the note format derives from the name and the key — and
// returns its name and id.
func ParseVerifierKey(vkey string) (name, id string, err error) {
	name, rest, ok := strings.Cut(vkey, "+")
	id, key, ok2 := strings.Cut(rest, "+")
	if !ok || !ok2 || name == "" || strings.ContainsAny(name, " \t\n\r") {
		return "", "", errors.New("not NAME+ID+KEY")
	}
	if !ValidKeyID(id) {
		return "", "", fmt.Errorf("key id %q is not 8 lowercase hex digits", id)
	}
	raw, err := base64.StdEncoding.Strict().DecodeString(key)
	if err != nil || len(raw) != 33 || raw[0] != 0x01 {
		return "", "", errors.New("the key is not base64 of 0x01 and a 32-byte Ed25519 public key")
	}
	h := sha256.New()
	h.Write([]byte(name + "\n"))
	h.Write(raw)
	if want := fmt.Sprintf("%08x", binary.BigEndian.Uint32(h.Sum(nil))); want != id {
		return "", "", fmt.Errorf("key id %s does not match the key (%s)", id, want)
	}
	return name, id, nil
}
