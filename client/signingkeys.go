package client

import (
	"context"
	"net/http"
)

// KeyRotation is one key receipt of a namespace (SPEC §9.2): the verifier
// key it announced and the id of the key it retired.
type KeyRotation struct {
	Seq        uint64 `json:"seq"`
	VKey       string `json:"vkey"`
	KeyID      string `json:"key_id"`
	Retires    string `json:"retires"`
	Actor      string `json:"actor"`
	RecordedAt uint64 `json:"recorded_at"`
}

// Rotated is the answer to a rotation: the key receipt and what it says.
type Rotated struct {
	Receipt ReceiptRef `json:"receipt"`
	KeyRotation
}

// SigningKeys is a namespace's key history and the keys that signed its
// latest checkpoint.
type SigningKeys struct {
	// Current is the id of the key announced last; nil when none was.
	Current        *string       `json:"current"`
	Rotations      []KeyRotation `json:"rotations"`
	CheckpointKeys []string      `json:"checkpoint_keys"`
	CheckpointSize int64         `json:"checkpoint_size"`
}

// RotateKey announces vkey as the namespace's checkpoint signing key,
// retiring the key in use, or the key id retires when not empty (an admin
// token when tokens exist). Errors: ErrInvalidRequest (a malformed key,
// one of another name), ErrKeyRotationConflict.
func (c *Client) RotateKey(ctx context.Context, vkey, retires string) (*Rotated, error) {
	body := map[string]string{"vkey": vkey}
	if retires != "" {
		body["retires"] = retires
	}
	var out Rotated
	if _, err := c.exchange(ctx, "rotate key", http.MethodPost, c.route("/v1/signing-keys"), body, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// SigningKeys reads the namespace's key history.
func (c *Client) SigningKeys(ctx context.Context) (*SigningKeys, error) {
	var out SigningKeys
	if _, err := c.exchange(ctx, "signing keys", http.MethodGet, c.route("/v1/signing-keys"), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
