package tlog

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"syscall"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
	"golang.org/x/mod/sumdb/note"
)

// GenerateKey returns a new note private key (PRIVATE+KEY+… form) and its
// verifier key for the origin prefix name.
func GenerateKey(name string) (skey, vkey string, err error) {
	skey, vkey, err = note.GenerateKey(rand.Reader, name)
	if err != nil {
		return "", "", fmt.Errorf("generate key: %w", err)
	}
	return skey, vkey, nil
}

// AgentPrefix starts a --signing-key that names an ssh-agent identity.
const AgentPrefix = "ssh-agent:"

// KeyOptions are how LoadSigner treats a private key file.
type KeyOptions struct {
	// AllowReadable uses a key file that group or others may read
	// (logging a warning through Logger) instead of refusing it.
	AllowReadable bool
	// Logger receives that warning; nil: slog.Default().
	Logger *slog.Logger
}

// ErrKeyFile is the parent of the errors about a private key file that is
// not used: not a regular file, or readable by group or others.
var ErrKeyFile = errors.New("private key file refused")

// readKeyFile reads a private key file the way OpenSSH does: a regular
// file only (a FIFO or a device would block or never end), and one that
// neither group nor others may read or write, since anyone who can read it
// can sign checkpoints in the log's name.
func readKeyFile(path string, o KeyOptions) ([]byte, error) {
	// O_NONBLOCK: opening a FIFO for reading must not wait for a writer.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s is not a regular file (%s)", ErrKeyFile, path, fi.Mode().Type())
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		if !o.AllowReadable {
			return nil, fmt.Errorf("%w: %s has permissions %04o: group or others may use it (chmod 600 %s, as ssh requires)", ErrKeyFile, path, perm, path)
		}
		logger := o.Logger
		if logger == nil {
			logger = slog.Default()
		}
		logger.Warn("the signing key file may be read by group or others; anyone who reads it can sign checkpoints in the log's name",
			"path", path, "mode", fmt.Sprintf("%04o", perm))
	}
	return io.ReadAll(io.LimitReader(f, 1<<20))
}

// LoadSigner returns the checkpoint signer that spec names, with name as
// the key name (the origin prefix), and its verifier key. spec is a file
// holding a note private key (its name must be name) or an OpenSSH
// Ed25519 private key, or "ssh-agent:<fingerprint>" for an Ed25519
// identity held by the agent at $SSH_AUTH_SOCK (fingerprint as printed by
// ssh-add -l, "SHA256:…"). The caller closes the returned io.Closer-like
// func when done (it closes the agent connection; a no-op otherwise). A
// key file must be a regular file that only its owner may use (see
// KeyOptions).
func LoadSigner(spec, name string, o KeyOptions) (note.Signer, string, func() error, error) {
	noop := func() error { return nil }
	if fp, ok := strings.CutPrefix(spec, AgentPrefix); ok {
		return agentSigner(fp, name)
	}
	data, err := readKeyFile(spec, o)
	if err != nil {
		return nil, "", noop, fmt.Errorf("signing key: %w", err)
	}
	if text := strings.TrimSpace(string(data)); strings.HasPrefix(text, "PRIVATE+KEY+") {
		s, vkey, _, err := LoadSignerText(text, name)
		if err != nil {
			return nil, "", noop, fmt.Errorf("signing key %s: %w", spec, err)
		}
		return s, vkey, noop, nil
	}
	raw, err := ssh.ParseRawPrivateKey(data)
	if err != nil {
		var pe *ssh.PassphraseMissingError
		if errors.As(err, &pe) {
			return nil, "", noop, fmt.Errorf("signing key %s is passphrase-protected: load it into ssh-agent and use --signing-key ssh-agent:<fingerprint>", spec)
		}
		return nil, "", noop, fmt.Errorf("signing key %s is neither a note key nor an OpenSSH private key: %w", spec, err)
	}
	var priv ed25519.PrivateKey
	switch k := raw.(type) {
	case ed25519.PrivateKey:
		priv = k
	case *ed25519.PrivateKey:
		priv = *k
	default:
		return nil, "", noop, fmt.Errorf("signing key %s is a %T, want Ed25519", spec, raw)
	}
	s, vkey, err := newEd25519Signer(name, priv.Public().(ed25519.PublicKey), func(msg []byte) ([]byte, error) {
		return ed25519.Sign(priv, msg), nil
	})
	return s, vkey, noop, err
}

// LoadSignerText returns the signer of a note private key
// (PRIVATE+KEY+…) whose name must be name, and its verifier key.
func LoadSignerText(skey, name string) (note.Signer, string, func() error, error) {
	noop := func() error { return nil }
	s, err := note.NewSigner(skey)
	if err != nil {
		return nil, "", noop, fmt.Errorf("note key: %w", err)
	}
	if s.Name() != name {
		return nil, "", noop, fmt.Errorf("the key is for %q, but the log origin prefix is %q (set --log-origin %s, or make a key with ledgerctl keygen --origin %s)",
			s.Name(), name, s.Name(), name)
	}
	vkey, err := verifierKeyOf(skey)
	if err != nil {
		return nil, "", noop, err
	}
	return s, vkey, noop, nil
}

// verifierKeyOf derives the verifier key from a note private key
// PRIVATE+KEY+<name>+<hash>+<base64(0x01 ‖ seed)>.
func verifierKeyOf(skey string) (string, error) {
	parts := strings.SplitN(skey, "+", 5) // base64 may hold "+"
	if len(parts) != 5 {
		return "", errors.New("malformed note private key")
	}
	s, err := note.NewSigner(skey)
	if err != nil {
		return "", err
	}
	// The note package does not export the public key: derive it from
	// the seed and check it against the key hash.
	seed, err := decodeKeyData(parts[4])
	if err != nil {
		return "", err
	}
	pub := ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey)
	vkey, err := note.NewEd25519VerifierKey(s.Name(), pub)
	if err != nil {
		return "", err
	}
	v, err := note.NewVerifier(vkey)
	if err != nil || v.KeyHash() != s.KeyHash() {
		return "", errors.New("note private key does not match its key hash")
	}
	return vkey, nil
}

// ed25519Signer is a note.Signer over any Ed25519 signing function.
type ed25519Signer struct {
	name string
	hash uint32
	sign func([]byte) ([]byte, error)
}

func (s *ed25519Signer) Name() string                    { return s.name }
func (s *ed25519Signer) KeyHash() uint32                 { return s.hash }
func (s *ed25519Signer) Sign(msg []byte) ([]byte, error) { return s.sign(msg) }

var _ note.Signer = (*ed25519Signer)(nil)

func newEd25519Signer(name string, pub ed25519.PublicKey, sign func([]byte) ([]byte, error)) (note.Signer, string, error) {
	vkey, err := note.NewEd25519VerifierKey(name, pub)
	if err != nil {
		return nil, "", fmt.Errorf("verifier key: %w", err)
	}
	v, err := note.NewVerifier(vkey)
	if err != nil {
		return nil, "", fmt.Errorf("verifier key: %w", err)
	}
	return &ed25519Signer{name: name, hash: v.KeyHash(), sign: sign}, vkey, nil
}

// agentSigner signs with the Ed25519 identity of fingerprint fp held by
// the ssh-agent at $SSH_AUTH_SOCK.
func agentSigner(fp, name string) (note.Signer, string, func() error, error) {
	noop := func() error { return nil }
	sock := os.Getenv("SSH_AUTH_SOCK")
	if sock == "" {
		return nil, "", noop, errors.New("signing key ssh-agent: SSH_AUTH_SOCK is not set")
	}
	conn, err := net.Dial("unix", sock)
	if err != nil {
		return nil, "", noop, fmt.Errorf("signing key ssh-agent: %w", err)
	}
	ac := agent.NewClient(conn)
	keys, err := ac.List()
	if err != nil {
		_ = conn.Close()
		return nil, "", noop, fmt.Errorf("signing key ssh-agent: list identities: %w", err)
	}
	want := strings.TrimPrefix(fp, "SHA256:")
	for _, k := range keys {
		pk, err := ssh.ParsePublicKey(k.Marshal())
		if err != nil || strings.TrimPrefix(ssh.FingerprintSHA256(pk), "SHA256:") != want {
			continue
		}
		cpk, ok := pk.(ssh.CryptoPublicKey)
		if !ok {
			break
		}
		pub, ok := cpk.CryptoPublicKey().(ed25519.PublicKey)
		if !ok {
			_ = conn.Close()
			return nil, "", noop, fmt.Errorf("signing key ssh-agent:%s is a %s key, want ssh-ed25519", fp, pk.Type())
		}
		s, vkey, err := newEd25519Signer(name, pub, func(msg []byte) ([]byte, error) {
			sig, err := ac.Sign(pk, msg)
			if err != nil {
				return nil, fmt.Errorf("ssh-agent sign: %w", err)
			}
			if sig.Format != ssh.KeyAlgoED25519 || len(sig.Blob) != ed25519.SignatureSize {
				return nil, fmt.Errorf("ssh-agent returned a %s signature", sig.Format)
			}
			return sig.Blob, nil
		})
		if err != nil {
			_ = conn.Close()
			return nil, "", noop, err
		}
		return s, vkey, conn.Close, nil
	}
	_ = conn.Close()
	return nil, "", noop, fmt.Errorf("signing key ssh-agent: no identity with fingerprint %s (see ssh-add -l)", fp)
}

// NewVerifier parses a verifier key (<name>+<hash>+<base64 key>).
func NewVerifier(vkey string) (note.Verifier, error) {
	v, err := note.NewVerifier(strings.TrimSpace(vkey))
	if err != nil {
		return nil, fmt.Errorf("verifier key: %w", err)
	}
	return v, nil
}

func decodeKeyData(s string) ([]byte, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b) != 1+ed25519.SeedSize || b[0] != 1 {
		return nil, errors.New("malformed note private key data")
	}
	return b[1:], nil
}
