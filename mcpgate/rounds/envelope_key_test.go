package rounds

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestOnceKey: a key once loaded is kept (load is not called again); a
// load that failed — a ledger out of reach — is tried again at the next
// need; a short key is refused and not kept.
func TestOnceKey(t *testing.T) {
	calls := 0
	results := []struct {
		key []byte
		err error
	}{
		{nil, errors.New("ledger out of reach")},
		{[]byte("short"), nil},
		{bytes.Repeat([]byte{7}, StateKeyLen), nil},
		{bytes.Repeat([]byte{8}, StateKeyLen), nil},
	}
	get := OnceKey(func() ([]byte, error) {
		r := results[calls]
		calls++
		return r.key, r.err
	})
	_, err := get()
	assert.ErrorContains(t, err, "out of reach")
	_, err = get()
	assert.ErrorContains(t, err, "state key of 5 bytes")
	key, err := get()
	require.NoError(t, err)
	assert.Equal(t, results[2].key, key)
	again, err := get()
	require.NoError(t, err)
	assert.Equal(t, key, again, "kept")
	assert.Equal(t, 3, calls)
}
