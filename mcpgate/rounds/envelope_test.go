package rounds_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/mcpgate/rounds"
)

// TestLoadStateKey: the key is created on first use, mode 0600, and read
// back the same by every later load; a file that holds no key is refused.
func TestLoadStateKey(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "state", "mcp.db.mcp-key")
		first, err := rounds.LoadStateKey(path)
		require.NoError(t, err)
		assert.Len(t, first, 32)
		fi, err := os.Stat(path)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
		again, err := rounds.LoadStateKey(path)
		require.NoError(t, err)
		assert.Equal(t, first, again)
	})
	t.Run("ErrNotAKey", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "key")
		require.NoError(t, os.WriteFile(path, []byte("short\n"), 0o600))
		_, err := rounds.LoadStateKey(path)
		assert.Error(t, err)
	})
}
