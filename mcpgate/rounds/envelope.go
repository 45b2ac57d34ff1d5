package rounds

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// The rounds of one MCP call are one execution: the requestState the
// gateway returns with an input_required answer is an
// envelope that names the execution and its next attempt and carries the
// upstream's own state, authenticated with a key kept in the ledger
// (mcpgate.Config.StateKey: derived from the namespace's secret, for a --ledger
// per token, ledger.MCPStateKey), so the next round continues the same
// execution even on another replica of the gateway or after a restart.
//
// Format: "lrs1." + base64url(JSON envelope) + "." +
// base64url(HMAC-SHA256(key, "lrs1." + base64url(JSON envelope))).

const envelopePrefix = "lrs1."

// MaxEnvelopeAge is how long an envelope may be answered: a person may
// take time to confirm, but not forever.
const MaxEnvelopeAge = 24 * time.Hour

// Envelope is the gateway's requestState.
type Envelope struct {
	Key     string `json:"key"`     // the call's idempotency key
	Exec    string `json:"exec"`    // the execution of the call's rounds
	Attempt uint64 `json:"attempt"` // the next round's attempt
	Tool    string `json:"tool"`    // the ledger's tool name
	Input   string `json:"input"`   // the fingerprint of the call's arguments
	Up      string `json:"up,omitempty"`
	// Ask is set on a round that asked the client to approve the call
	// (package approve): the ask's seq, which its answer goes to.
	Ask uint64 `json:"ask,omitempty"`
	Exp int64  `json:"exp"` // unix ms after which it is refused
}

// ErrEnvelope is a requestState the gateway did not make, or not for
// this call: the call is refused as invalid params.
var ErrEnvelope = errors.New("requestState")

// Seal encodes and authenticates e with key.
func Seal(key []byte, e Envelope) (string, error) {
	b, err := json.Marshal(e)
	if err != nil {
		return "", fmt.Errorf("seal requestState: %w", err)
	}
	body := envelopePrefix + base64.RawURLEncoding.EncodeToString(b)
	return body + "." + base64.RawURLEncoding.EncodeToString(mac(key, body)), nil
}

// Open checks s with key and decodes it; it fails for a state that is
// not an envelope, does not authenticate, or has expired at now.
func Open(key []byte, s string, now time.Time) (*Envelope, error) {
	i := strings.LastIndexByte(s, '.')
	if i < 0 || !strings.HasPrefix(s, envelopePrefix) {
		return nil, fmt.Errorf("%w: not one this gateway issued", ErrEnvelope)
	}
	body := s[:i]
	got, err := base64.RawURLEncoding.DecodeString(s[i+1:])
	if err != nil || !hmac.Equal(got, mac(key, body)) {
		return nil, fmt.Errorf("%w: does not authenticate", ErrEnvelope)
	}
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(body, envelopePrefix))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrEnvelope, err)
	}
	var e Envelope
	if err := json.Unmarshal(b, &e); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrEnvelope, err)
	}
	if now.UnixMilli() > e.Exp {
		return nil, fmt.Errorf("%w: expired", ErrEnvelope)
	}
	return &e, nil
}

func mac(key []byte, body string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(body))
	return h.Sum(nil)
}

// OnceKey calls load until it succeeds, and checks the key's size: a
// load that failed (a ledger out of reach) is tried again at the next
// round that needs the key, and a key once loaded is kept.
func OnceKey(load func() ([]byte, error)) func() ([]byte, error) {
	var mu sync.Mutex
	var key []byte
	return func() ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		if key != nil {
			return key, nil
		}
		k, err := load()
		if err != nil {
			return nil, err
		}
		if len(k) < StateKeyLen {
			return nil, fmt.Errorf("state key of %d bytes, want at least %d", len(k), StateKeyLen)
		}
		key = k
		return key, nil
	}
}

// StateKeyLen is the size of the key that authenticates envelopes.
const StateKeyLen = 32

// LoadStateKey reads the key that authenticates the gateway's
// requestState envelopes from path, creating the file (mode 0600, 32
// random bytes in hex) when it does not exist: --state-key-file, the
// <db>.mcp-key an earlier gateway made, or the fallback for a ledgerd
// that keeps no key. Every gateway that shares a ledger must use the
// same file's key; it survives restarts.
func LoadStateKey(path string) ([]byte, error) {
	for range 2 {
		b, err := os.ReadFile(path)
		if err == nil {
			key, err := hex.DecodeString(strings.TrimSpace(string(b)))
			if err != nil || len(key) < StateKeyLen {
				return nil, fmt.Errorf("state key %s: not %d hex-encoded bytes", path, StateKeyLen)
			}
			return key, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("state key: %w", err)
		}
		if err := createStateKey(path); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, err
		}
	}
	return nil, fmt.Errorf("state key %s: cannot be read after creating it", path)
}

// createStateKey writes a new key to path, which must not exist.
func createStateKey(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("state key: %w", err)
	}
	key := make([]byte, StateKeyLen)
	_, _ = rand.Read(key)
	tmp := fmt.Sprintf("%s.%s.tmp", path, rand.Text())
	if err := os.WriteFile(tmp, []byte(hex.EncodeToString(key)+"\n"), 0o600); err != nil {
		return fmt.Errorf("state key: %w", err)
	}
	defer func() { _ = os.Remove(tmp) }()
	// A link fails if another gateway created the file first: both then
	// read the one that won.
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, os.ErrExist) {
			return err
		}
		return fmt.Errorf("state key: %w", err)
	}
	return nil
}
