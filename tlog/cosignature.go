package tlog

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"golang.org/x/mod/sumdb/note"
)

// C2SP tlog-cosignature (Ed25519, cosignature/v1): a witness signs
// "cosignature/v1\ntime <T>\n" followed by the checkpoint's note text, and
// the signature line carries timestamp(8, big-endian) ‖ Ed25519 signature.
// Its verifier key is <name>+<key id>+base64(0x04 ‖ public key), the key id
// being SHA-256(name ‖ "\n" ‖ 0x04 ‖ public key)[:4].
const algCosignatureV1 = 0x04

// cosignatureKeyHash is the key id of a cosignature/v1 key.
func cosignatureKeyHash(name string, pub ed25519.PublicKey) uint32 {
	h := sha256.New()
	h.Write([]byte(name))
	h.Write([]byte{'\n', algCosignatureV1})
	h.Write(pub)
	return binary.BigEndian.Uint32(h.Sum(nil))
}

// cosignedMessage is the message a cosignature/v1 signs at time t.
func cosignedMessage(t uint64, text []byte) []byte {
	return append([]byte("cosignature/v1\ntime "+strconv.FormatUint(t, 10)+"\n"), text...)
}

// cosignatureVerifier is a note.Verifier for cosignature/v1 lines.
type cosignatureVerifier struct {
	name string
	hash uint32
	pub  ed25519.PublicKey
}

func (v *cosignatureVerifier) Name() string    { return v.name }
func (v *cosignatureVerifier) KeyHash() uint32 { return v.hash }

// Verify checks sig (timestamp ‖ Ed25519 signature) over the cosigned
// message of the note text msg. Timestamps over 2^63-1 are refused.
func (v *cosignatureVerifier) Verify(msg, sig []byte) bool {
	if len(sig) != 8+ed25519.SignatureSize {
		return false
	}
	t := binary.BigEndian.Uint64(sig)
	if t > 1<<63-1 {
		return false
	}
	return ed25519.Verify(v.pub, cosignedMessage(t, msg), sig[8:])
}

var _ note.Verifier = (*cosignatureVerifier)(nil)

// ErrCosignatureKey means a witness verifier key is malformed or not an
// Ed25519 cosignature/v1 key.
var ErrCosignatureKey = errors.New("malformed witness verifier key")

// NewCosignatureVerifier parses a witness verifier key
// <name>+<hex key id>+base64(0x04 ‖ Ed25519 public key) (C2SP
// tlog-cosignature) into a note.Verifier of its cosignature lines.
func NewCosignatureVerifier(vkey string) (note.Verifier, error) {
	vkey = strings.TrimSpace(vkey)
	name, rest, ok1 := strings.Cut(vkey, "+")
	hash16, key64, ok2 := strings.Cut(rest, "+")
	if !ok1 || !ok2 || name == "" || len(hash16) != 8 {
		return nil, fmt.Errorf("%w: want NAME+KEYID+BASE64", ErrCosignatureKey)
	}
	hash, err1 := strconv.ParseUint(hash16, 16, 32)
	key, err2 := base64.StdEncoding.DecodeString(key64)
	if err1 != nil || err2 != nil || len(key) != 1+ed25519.PublicKeySize {
		return nil, fmt.Errorf("%w: bad key id or key data", ErrCosignatureKey)
	}
	if key[0] != algCosignatureV1 {
		return nil, fmt.Errorf("%w: key type 0x%02x, want 0x04 (Ed25519 cosignature/v1)", ErrCosignatureKey, key[0])
	}
	pub := ed25519.PublicKey(key[1:])
	if uint32(hash) != cosignatureKeyHash(name, pub) {
		return nil, fmt.Errorf("%w: key id does not match the key", ErrCosignatureKey)
	}
	return &cosignatureVerifier{name: name, hash: uint32(hash), pub: pub}, nil
}

// CosignatureSigner is a note.Signer that makes cosignature/v1 lines, as
// a witness does.
type CosignatureSigner struct {
	name string
	hash uint32
	priv ed25519.PrivateKey
	// Now is the clock of the timestamps (time.Now when nil).
	Now func() time.Time
}

// NewCosignatureSigner returns the cosignature signer of an Ed25519 key.
func NewCosignatureSigner(name string, priv ed25519.PrivateKey) *CosignatureSigner {
	return &CosignatureSigner{name: name, hash: cosignatureKeyHash(name, priv.Public().(ed25519.PublicKey)), priv: priv}
}

// Name is the witness name.
func (s *CosignatureSigner) Name() string { return s.name }

// KeyHash is the cosignature/v1 key id.
func (s *CosignatureSigner) KeyHash() uint32 { return s.hash }

// Sign returns timestamp ‖ signature of the cosigned message of msg.
func (s *CosignatureSigner) Sign(msg []byte) ([]byte, error) {
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	t := uint64(now().Unix())
	sig := make([]byte, 8, 8+ed25519.SignatureSize)
	binary.BigEndian.PutUint64(sig, t)
	return append(sig, ed25519.Sign(s.priv, cosignedMessage(t, msg))...), nil
}

// VerifierKey returns the signer's witness verifier key.
func (s *CosignatureSigner) VerifierKey() string {
	pub := s.priv.Public().(ed25519.PublicKey)
	return fmt.Sprintf("%s+%08x+%s", s.name, s.hash,
		base64.StdEncoding.EncodeToString(append([]byte{algCosignatureV1}, pub...)))
}

var _ note.Signer = (*CosignatureSigner)(nil)

// GenerateCosignatureKey returns a new witness key named name.
func GenerateCosignatureKey(name string) (*CosignatureSigner, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate witness key: %w", err)
	}
	return NewCosignatureSigner(name, priv), nil
}

// ErrCosignature is the parent of every cosignature that does not verify.
var ErrCosignature = errors.New("cosignature does not verify")

// VerifyCosignatures returns the signature lines among lines that are
// valid cosignatures by v of the checkpoint note text: lines by other keys
// are ignored; none valid, or one by v that does not verify, is an error.
func VerifyCosignatures(text string, lines []string, v note.Verifier) ([]string, error) {
	var msg strings.Builder
	msg.WriteString(text)
	msg.WriteString("\n")
	n := 0
	for _, l := range lines {
		if l == "" {
			continue
		}
		msg.WriteString(l)
		msg.WriteString("\n")
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("%w: no signature line", ErrCosignature)
	}
	opened, err := note.Open([]byte(msg.String()), note.VerifierList(v))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCosignature, err)
	}
	out := make([]string, 0, len(opened.Sigs))
	for _, s := range opened.Sigs {
		out = append(out, "— "+s.Name+" "+s.Base64)
	}
	return out, nil
}

// CountCosigners returns how many of the verifiers have a valid
// cosignature on the signed note msg (the log's signature is checked by
// the caller). Signatures by other keys are ignored; a signature that
// claims one of the keys but does not verify is not counted.
func CountCosigners(msg []byte, vs []note.Verifier) int {
	text := NoteText(msg)
	sigs := strings.Split(strings.TrimSuffix(string(msg[len(text):]), "\n"), "\n")
	n := 0
	for _, v := range vs {
		if _, err := VerifyCosignatures(text, sigs, v); err == nil {
			n++
		}
	}
	return n
}
