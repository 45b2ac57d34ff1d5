package client

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
)

// Payload modes of a namespace (SPEC §14), as DerivationKey.Payloads
// names them.
const (
	PayloadsInline    = "inline"
	PayloadsCommitted = "committed"
)

// DerivedKey2Prefix starts every key DeriveKeyWith makes: a key derived
// in a namespace that commits its payloads (SPEC §14).
const DerivedKey2Prefix = "dk2_"

// DeriveKeyWith returns the derived idempotency key of a call of tool
// with input in a committed namespace whose fingerprint key is key:
//
//	key = "dk2_" + hex(HMAC-SHA-256(key, tool ‖ 0x00 ‖ JCS(input)))
//
// Like DeriveKey it is stable across member order, spacing and number
// spelling, and the Python and TypeScript clients derive the same. The
// ledger's writers know key; a reader of the chain does not, so a dk2_
// key does not let a reader confirm a guessed input, as a dk_ key does.
func DeriveKeyWith(key []byte, tool string, input any) (string, error) {
	if len(key) == 0 {
		return "", errors.New("derive key: empty derivation key")
	}
	if tool == "" {
		return "", errors.New("derive key: empty tool")
	}
	canon, err := canonical(input)
	if err != nil {
		return "", fmt.Errorf("derive key: %w", err)
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte(tool))
	m.Write([]byte{0})
	m.Write(canon)
	return DerivedKey2Prefix + hex.EncodeToString(m.Sum(nil)), nil
}

// DerivationKey is what a namespace derives idempotency keys with (GET
// /v1/derivation-key): its payload mode in force and its fingerprint key.
type DerivationKey struct {
	// Payloads is "inline" or "committed" (SPEC §14).
	Payloads string
	// Key is the namespace's fingerprint key (32 bytes); nil from a
	// ledgerd before v1.4, whose namespaces are all inline.
	Key []byte
}

// DeriveKey returns the derived key of a call of tool with input in the
// namespace dk describes: DeriveKeyWith in a committed namespace,
// DeriveKey (dk_) in an inline one or when dk is nil.
func (dk *DerivationKey) DeriveKey(tool string, input any) (string, error) {
	if dk == nil || dk.Payloads != PayloadsCommitted {
		return DeriveKey(tool, input)
	}
	return DeriveKeyWith(dk.Key, tool, input)
}

// DerivationKey returns the derivation key of the client's namespace: it
// asks the ledger the first time (GET /v1/derivation-key, a writer or
// admin token) and keeps the answer for the client's life, so a
// namespace that switches to committed derives dk2_ keys from the
// client's next start. A failed request is not kept: the next call asks
// again. A ledgerd before v1.4 (404 not_found) has inline namespaces
// only: the answer is then inline with no key.
func (c *Client) DerivationKey(ctx context.Context) (*DerivationKey, error) {
	c.dkMu.Lock()
	defer c.dkMu.Unlock()
	if c.dk != nil {
		return c.dk, nil
	}
	dk, err := c.fetchDerivationKey(ctx)
	if err != nil {
		return nil, err
	}
	c.dk = dk
	return dk, nil
}

// fetchDerivationKey asks the ledger for the namespace's derivation key,
// retrying what the server did not answer.
func (c *Client) fetchDerivationKey(ctx context.Context) (*DerivationKey, error) {
	var b struct {
		Payloads string `json:"payloads"`
		Key      string `json:"key"`
	}
	for n := 0; ; n++ {
		_, err := c.exchange(ctx, "derivation key", http.MethodGet, c.route("/v1/derivation-key"), nil, &b)
		if err == nil {
			break
		}
		var e *Error
		if errors.As(err, &e) && e.Code == string(ErrNotFound.(code)) {
			return &DerivationKey{Payloads: PayloadsInline}, nil
		}
		if !retryable(err) || n >= c.maxRetries {
			return nil, fmt.Errorf("derivation key: %w", err)
		}
		if perr := c.pause(ctx, n, err, "derivation key"); perr != nil {
			return nil, fmt.Errorf("derivation key: %w", perr)
		}
	}
	key, err := hex.DecodeString(b.Key)
	switch {
	case b.Payloads != PayloadsInline && b.Payloads != PayloadsCommitted:
		return nil, fmt.Errorf("derivation key: unknown payload mode %q", b.Payloads)
	case err != nil || len(key) != sha256.Size:
		return nil, errors.New("derivation key: not 32 hex-encoded bytes")
	}
	return &DerivationKey{Payloads: b.Payloads, Key: key}, nil
}
