package tasks

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
)

// A task's handle — the taskId the client sees — is not the upstream's
// task id but a sealed taskHandle: the upstream's id, the call's key and
// reservation, and who may use it, encrypted and authenticated
// (AES-256-GCM) with a key derived from the gateway's state key (the one
// kept in the ledger, which authenticates requestState envelopes too). So a task
// outlives the gateway that started it: after a restart, or on another
// replica of a gateway that shares the ledger and token, the client's
// next tasks/get opens the handle, is forwarded, and the task's terminal
// status is committed with the reservation it carries. The reservation
// is a secret, hence the encryption; the handle never goes on the chain.
//
// Format: "ltk1." + base64url(nonce ‖ AES-GCM(JSON taskHandle)).

const handlePrefix = "ltk1."

// maxHandleAge is how long a handle may be used: past the longest task
// lease (a late commit is still possible), then refused.
const maxHandleAge = 2 * maxTaskLease

// taskHandle is what a task's handle carries.
type taskHandle struct {
	ID    string `json:"id"`              // the upstream's task id
	Key   string `json:"key,omitempty"`   // the call's idempotency key; "" for a read
	Token string `json:"token,omitempty"` // the reservation that commits
	Tool  string `json:"tool,omitempty"`  // the upstream's tool name
	// Failed: the tool's errors are recorded failed (on_error), not
	// not_applied.
	Failed bool   `json:"failed,omitempty"`
	Ext    bool   `json:"ext,omitempty"` // a task of the 2026-07-28 extension
	Owner  string `json:"owner"`         // owner of the call
	Exp    int64  `json:"exp"`           // unix ms after which it is refused
}

// errHandle is a taskId the gateway did not hand out, or not to this
// client: the request is refused as invalid params.
var errHandle = errors.New("unknown task")

// handleAEAD is the cipher of task handles under the state key.
func handleAEAD(stateKey []byte) (cipher.AEAD, error) {
	m := hmac.New(sha256.New, stateKey)
	m.Write([]byte("effect-ledger/mcp task handle v1"))
	block, err := aes.NewCipher(m.Sum(nil))
	if err != nil {
		return nil, fmt.Errorf("task handle: %w", err)
	}
	return cipher.NewGCM(block)
}

// sealHandle encrypts h into a handle.
func sealHandle(stateKey []byte, h taskHandle) (string, error) {
	aead, err := handleAEAD(stateKey)
	if err != nil {
		return "", err
	}
	b, err := json.Marshal(h)
	if err != nil {
		return "", fmt.Errorf("task handle: %w", err)
	}
	nonce := make([]byte, aead.NonceSize())
	_, _ = rand.Read(nonce)
	return handlePrefix + base64.RawURLEncoding.EncodeToString(aead.Seal(nonce, nonce, b, []byte(handlePrefix))), nil
}

// openHandle decrypts a handle; it fails for one the gateway did not
// make, one that expired at now, or one of another owner.
func openHandle(stateKey []byte, s, owner string, now time.Time) (*taskHandle, error) {
	body, ok := strings.CutPrefix(s, handlePrefix)
	if !ok {
		return nil, errHandle
	}
	b, err := base64.RawURLEncoding.DecodeString(body)
	if err != nil {
		return nil, errHandle
	}
	aead, err := handleAEAD(stateKey)
	if err != nil {
		return nil, err
	}
	if len(b) < aead.NonceSize() {
		return nil, errHandle
	}
	plain, err := aead.Open(nil, b[:aead.NonceSize()], b[aead.NonceSize():], []byte(handlePrefix))
	if err != nil {
		return nil, errHandle
	}
	var h taskHandle
	if json.Unmarshal(plain, &h) != nil || h.Owner != owner {
		return nil, errHandle
	}
	if now.UnixMilli() > h.Exp {
		return nil, fmt.Errorf("%w: its handle expired", errHandle)
	}
	return &h, nil
}

// Rename replaces the upstream's task id in an answer with the
// handle the client sees, wherever the answer names it: a task's
// taskId (at the top, or in 2025-11-25's {"task": {…}}) and
// _meta[metaRelatedTask].taskId.
func Rename(raw json.RawMessage, from, to string) json.RawMessage {
	if from == "" || !bytes.Contains(raw, []byte(from)) {
		return raw
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber() // numbers pass as they came
	var obj map[string]any
	if d.Decode(&obj) != nil || obj == nil {
		return raw
	}
	swap := func(m map[string]any) {
		if m != nil && m["taskId"] == from {
			m["taskId"] = to
		}
	}
	swap(obj)
	t, _ := obj["task"].(map[string]any)
	swap(t)
	meta, _ := obj["_meta"].(map[string]any)
	rel, _ := meta[metaRelatedTask].(map[string]any)
	swap(rel)
	b, err := json.Marshal(obj)
	if err != nil {
		return raw
	}
	return b
}

// withTaskID is params with its taskId set to id.
func withTaskID(params json.RawMessage, id string) json.RawMessage {
	if len(params) == 0 {
		params = json.RawMessage(`{}`)
	}
	b, err := wire.WithMembers(params, map[string]any{"taskId": id})
	if err != nil {
		return params
	}
	return b
}
