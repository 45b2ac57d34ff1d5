package tlog

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/mod/sumdb/note"
)

// A log's checkpoints may carry several signatures by its keys while it
// hands over from one key to the next (SPEC §9.2); a verifier accepts a
// checkpoint signed by any one of the keys it trusts.

// KeyID is the key id of a verifier or signer: its key hash as 8
// lowercase hex digits, as in its verifier key NAME+ID+KEY.
func KeyID(k interface{ KeyHash() uint32 }) string { return fmt.Sprintf("%08x", k.KeyHash()) }

// SignatureKeys lists the key ids of the signature lines by keys named
// name in the signed note msg, in order, each once.
func SignatureKeys(msg []byte, name string) []string {
	i := bytes.Index(msg, []byte("\n\n"))
	if i < 0 {
		return nil
	}
	var ids []string
	seen := map[string]bool{}
	for _, line := range strings.Split(string(msg[i+2:]), "\n") {
		rest, ok := strings.CutPrefix(line, "— ")
		if !ok {
			continue
		}
		n, sig, ok := strings.Cut(rest, " ")
		if !ok || n != name {
			continue
		}
		b, err := base64.StdEncoding.DecodeString(sig)
		if err != nil || len(b) < 4 {
			continue
		}
		id := fmt.Sprintf("%08x", binary.BigEndian.Uint32(b))
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids
}

// OpenCheckpointAny is OpenCheckpoint with several keys of one name: the
// checkpoint must carry a valid signature by at least one of them. It
// returns the ids of the keys whose signatures verified. With no valid
// signature the error wraps ErrCheckpointSignature and names the ids of
// the keys of that name that signed.
func OpenCheckpointAny(msg []byte, vs []note.Verifier, ns string) (Checkpoint, []string, error) {
	if len(vs) == 0 {
		return Checkpoint{}, nil, fmt.Errorf("%w: no verifier key", ErrCheckpointSignature)
	}
	n, err := note.Open(msg, note.VerifierList(vs...))
	if err != nil {
		var ue *note.UnverifiedNoteError
		var ie *note.InvalidSignatureError
		if errors.As(err, &ue) || errors.As(err, &ie) {
			ids := SignatureKeys(msg, vs[0].Name())
			return Checkpoint{}, nil, fmt.Errorf("%w: %w (signed by key ids %s of %q)", ErrCheckpointSignature, err, idList(ids), vs[0].Name())
		}
		return Checkpoint{}, nil, fmt.Errorf("%w: %w", ErrBadCheckpoint, err)
	}
	var ids []string
	for _, s := range n.Sigs {
		ids = append(ids, fmt.Sprintf("%08x", s.Hash))
	}
	// The origin is checked against the name of a key that verified.
	var signer note.Verifier
	for _, v := range vs {
		if v.Name() == n.Sigs[0].Name && v.KeyHash() == n.Sigs[0].Hash {
			signer = v
		}
	}
	c, err := OpenCheckpoint(msg, signer, ns)
	return c, ids, err
}

func idList(ids []string) string {
	if len(ids) == 0 {
		return "none"
	}
	return strings.Join(ids, ", ")
}

// SignCheckpoint returns the signed note of c with a signature by each
// signer, in order.
func SignCheckpoint(c Checkpoint, signers []note.Signer) ([]byte, error) {
	msg, err := note.Sign(&note.Note{Text: c.Text()}, signers...)
	if err != nil {
		return nil, fmt.Errorf("sign checkpoint: %w", err)
	}
	return msg, nil
}
