package hook

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/effect-ledger/effect-ledger/internal/atomicfile"
)

// State is the directory where a hook keeps what its next run needs: the
// reservation token between PreToolUse and PostToolUse, and the key of a
// call that awaits approval, so that the identical call later in the
// session presents the same key and consumes the approval. Files are
// 0600 in a 0700 directory: a token commits an effect.
type State struct {
	Dir string
	// Scope tells ledgers apart: the server and namespace, so that two
	// hooks writing to different ledgers never read each other's files.
	Scope string
}

// DefaultStateDir is $XDG_STATE_HOME/effect-ledger/hooks, with
// $XDG_STATE_HOME defaulting to ~/.local/state.
func DefaultStateDir() (string, error) {
	base := os.Getenv("XDG_STATE_HOME")
	if base == "" || !filepath.IsAbs(base) {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("state directory: %w", err)
		}
		base = filepath.Join(home, ".local", "state")
	}
	return filepath.Join(base, "effect-ledger", "hooks"), nil
}

// kept is a reservation kept between the two runs of a call's hook.
type kept struct {
	Key         string `json:"key"`
	Reservation string `json:"reservation"`
	Tool        string `json:"tool"`
}

// asked is the key of a call that awaits a person's answer.
type asked struct {
	Key string `json:"key"`
	Ask uint64 `json:"ask"`
}

// derivation is the namespace's derivation key as the hook keeps it.
type derivation struct {
	Payloads string `json:"payloads"`
	Key      string `json:"key"` // hex
}

// name returns the file name for kind and the parts that identify it:
// a hash, so that no session or tool id becomes a path.
func (s *State) name(kind string, parts ...string) string {
	h := sha256.New()
	h.Write([]byte(s.Scope))
	for _, p := range parts {
		h.Write([]byte{0})
		h.Write([]byte(p))
	}
	return filepath.Join(s.Dir, kind+"-"+hex.EncodeToString(h.Sum(nil)[:20])+".json")
}

func (s *State) reservation(session, toolUseID string) string {
	return s.name("rsv", session, toolUseID)
}

// derivationKey is the file of the ledger's derivation key: one per
// server and namespace (the State's Scope).
func (s *State) derivationKey() string { return s.name("dk") }

func (s *State) ask(session, tool, fingerprint string) string {
	return s.name("ask", session, tool, fingerprint)
}

// write stores v at path atomically, readable by the owner alone.
func (s *State) write(path string, v any) error {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return fmt.Errorf("hook state: %w", err)
	}
	if err := os.Chmod(s.Dir, 0o700); err != nil { // made before, by another hand
		return fmt.Errorf("hook state: %w", err)
	}
	data, err := json.Marshal(v)
	if err == nil {
		err = atomicfile.Write(path, data, 0o600)
	}
	if err != nil {
		return fmt.Errorf("hook state: %w", err)
	}
	return nil
}

// read loads path into v; ok is false when there is no such file.
func (s *State) read(path string, v any) (ok bool, err error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("hook state: %w", err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return false, fmt.Errorf("hook state %s: %w", filepath.Base(path), err)
	}
	return true, nil
}

// remove deletes path; a file already gone is no error.
func (s *State) remove(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("hook state: %w", err)
	}
	return nil
}
