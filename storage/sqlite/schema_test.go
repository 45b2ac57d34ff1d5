package sqlite_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/storage/sqlite"
)

// TestSchema_versionStamped: schema.sql stamps the version the driver
// serves, and the repository's top-level schema.sql is that file.
func TestSchema_versionStamped(t *testing.T) {
	raw, err := os.ReadFile("schema.sql")
	require.NoError(t, err)
	assert.Contains(t, string(raw), fmt.Sprintf("\nPRAGMA user_version = %d;", sqlite.SchemaVersion))
	top, err := os.ReadFile("../../schema.sql")
	require.NoError(t, err)
	assert.True(t, strings.EqualFold(string(top), string(raw)), "the top-level schema.sql is the driver's")
}
