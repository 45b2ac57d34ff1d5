package ledgertest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// CorruptTables flips the bytes of every table (.sst) of the Pebble
// directory dir (a key index) between fractions from and to of its length.
func CorruptTables(tb testing.TB, dir string, from, to float64) {
	tb.Helper()
	ssts, err := filepath.Glob(filepath.Join(dir, "*.sst"))
	require.NoError(tb, err)
	require.NotEmpty(tb, ssts)
	for _, f := range ssts {
		b, err := os.ReadFile(f)
		require.NoError(tb, err)
		for i := int(from * float64(len(b))); i < int(to*float64(len(b))); i++ {
			b[i] ^= 0x5a
		}
		require.NoError(tb, os.WriteFile(f, b, 0o644))
	}
}
