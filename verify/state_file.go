package verify

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/effect-ledger/effect-ledger/internal/atomicfile"
)

// ReadState reads the head pinned in a --state file; nil when the file
// does not exist yet (the first run).
func ReadState(path string) (*Pin, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read state: %w", err)
	}
	var p Pin
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("read state %s: %w", path, err)
	}
	pin, err := ParsePin(fmt.Sprintf("%d:%s", p.Seq, p.Hash))
	if err != nil {
		return nil, fmt.Errorf("read state %s: %w", path, err)
	}
	return pin, nil
}

// WriteState pins head in path atomically: a temp file in the same
// directory is written, synced and renamed over path, and the directory is
// synced, so a crash leaves either the old or the new state.
func WriteState(path string, head Pin) error { return writeJSONAtomic(path, head) }

// writeJSONAtomic writes v as JSON to path atomically (see WriteState).
func writeJSONAtomic(path string, v any) error {
	b, err := json.Marshal(v)
	if err == nil {
		err = atomicfile.Write(path, append(b, '\n'), 0o600)
	}
	if err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	return nil
}
