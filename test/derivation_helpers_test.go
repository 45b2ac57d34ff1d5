package test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage"
)

// fileDerivationKey is what a ledger-mcp on the ledger database db derives
// the keys of the default namespace with (SPEC §14): nothing in an inline
// namespace, the fingerprint key in a committed one, read from the file
// as ledgerctl would (waiting up to 10 s for the gateway to make it).
func fileDerivationKey(t *testing.T, db string) *client.DerivationKey {
	t.Helper()
	ctx := context.Background()
	st, _, err := storage.Open(ctx, db, storage.Options{ReadOnly: true})
	require.NoError(t, err)
	defer func() { _ = st.Close() }()
	c, err := st.Chain(ctx, ledger.DefaultNamespace)
	require.NoError(t, err)
	mode, err := c.Payloads(ctx)
	require.NoError(t, err)
	if mode != ledger.PayloadsCommitted {
		return &client.DerivationKey{Payloads: client.PayloadsInline}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		secret, err := c.StateKey(ctx)
		if errors.Is(err, ledger.ErrOpenedReadOnly) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond) // not made yet
			continue
		}
		require.NoError(t, err)
		key, err := ledger.FingerprintKey(secret)
		require.NoError(t, err)
		return &client.DerivationKey{Payloads: client.PayloadsCommitted, Key: key}
	}
}
