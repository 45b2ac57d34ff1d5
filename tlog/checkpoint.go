package tlog

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/note"
)

// DefaultOriginPrefix is the default --log-origin.
const DefaultOriginPrefix = "effect-ledger.local"

// DefaultNamespace is the namespace whose routes are unprefixed.
const DefaultNamespace = "default"

// Origin is the checkpoint origin of namespace ns under prefix: PREFIX/NS.
func Origin(prefix, ns string) string { return prefix + "/" + ns }

// Checkpoint is the body of a C2SP tlog-checkpoint: the origin line, the
// tree size and the root.
type Checkpoint struct {
	Origin string
	Size   int64
	Root   Hash
}

// Text is the checkpoint's note text: "<origin>\n<size>\n<base64 root>\n".
func (c Checkpoint) Text() string {
	return fmt.Sprintf("%s\n%d\n%s\n", c.Origin, c.Size, base64.StdEncoding.EncodeToString(c.Root[:]))
}

// ErrBadCheckpoint is the parent of every checkpoint parse error.
var ErrBadCheckpoint = errors.New("malformed checkpoint")

// ParseCheckpoint parses a checkpoint's note text (extension lines after
// the root are allowed and ignored, as C2SP tlog-checkpoint says).
func ParseCheckpoint(text string) (Checkpoint, error) {
	var c Checkpoint
	if !strings.HasSuffix(text, "\n") {
		return c, fmt.Errorf("%w: text does not end in a newline", ErrBadCheckpoint)
	}
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	if len(lines) < 3 {
		return c, fmt.Errorf("%w: want origin, size and root lines, got %d lines", ErrBadCheckpoint, len(lines))
	}
	if lines[0] == "" {
		return c, fmt.Errorf("%w: empty origin", ErrBadCheckpoint)
	}
	c.Origin = lines[0]
	n, err := strconv.ParseInt(lines[1], 10, 64)
	if err != nil || n < 0 || strconv.FormatInt(n, 10) != lines[1] {
		return c, fmt.Errorf("%w: bad tree size %q", ErrBadCheckpoint, lines[1])
	}
	c.Size = n
	root, err := base64.StdEncoding.Strict().DecodeString(lines[2]) // one text per root
	if err != nil || len(root) != len(c.Root) {
		return c, fmt.Errorf("%w: bad root hash %q", ErrBadCheckpoint, lines[2])
	}
	copy(c.Root[:], root)
	return c, nil
}

// Sign returns the signed note of c.
func Sign(c Checkpoint, s note.Signer) ([]byte, error) {
	msg, err := note.Sign(&note.Note{Text: c.Text()}, s)
	if err != nil {
		return nil, fmt.Errorf("sign checkpoint: %w", err)
	}
	return msg, nil
}

// ErrCheckpointSignature means a checkpoint carries no valid signature by
// the expected key.
var ErrCheckpointSignature = errors.New("checkpoint signature does not verify")

// ErrCheckpointOrigin means a checkpoint's origin is not the one expected.
var ErrCheckpointOrigin = errors.New("checkpoint origin is not the expected one")

// OpenCheckpoint verifies a signed checkpoint note with the verifier key
// vkey and parses it. Its origin must be the key's name followed by "/"
// and a namespace (SPEC §9: the key's name is the origin prefix); when ns
// is not empty it must be exactly Origin(name, ns). Other signature lines
// (witness cosignatures) are allowed.
func OpenCheckpoint(msg []byte, v note.Verifier, ns string) (Checkpoint, error) {
	n, err := note.Open(msg, note.VerifierList(v))
	if err != nil {
		var ue *note.UnverifiedNoteError
		var ie *note.InvalidSignatureError
		if errors.As(err, &ue) || errors.As(err, &ie) {
			return Checkpoint{}, fmt.Errorf("%w: %w", ErrCheckpointSignature, err)
		}
		return Checkpoint{}, fmt.Errorf("%w: %w", ErrBadCheckpoint, err)
	}
	c, err := ParseCheckpoint(n.Text)
	if err != nil {
		return c, err
	}
	want := v.Name() + "/"
	if ns != "" {
		want = Origin(v.Name(), ns)
		if c.Origin != want {
			return c, fmt.Errorf("%w: %q, want %q", ErrCheckpointOrigin, c.Origin, want)
		}
	} else if !strings.HasPrefix(c.Origin, want) || len(c.Origin) == len(want) {
		return c, fmt.Errorf("%w: %q does not start with %q", ErrCheckpointOrigin, c.Origin, want)
	}
	return c, nil
}

// NoteText returns the text part of a signed note (up to the blank line).
func NoteText(msg []byte) string {
	if i := bytes.Index(msg, []byte("\n\n")); i >= 0 {
		return string(msg[:i+1])
	}
	return string(msg)
}
