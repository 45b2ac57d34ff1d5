package tlog_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// portableJSON is the JSON form of a portable receipt of one receipt.
func portableJSON(t *testing.T) string {
	t.Helper()
	r := chain.Link(0, chain.Hash{}, chain.Receipt{Kind: "reserve", IdempotencyKey: "refund-order-1234",
		ExecutionID: "exec-1", Attempt: 1, Tool: "payments.refund", Effect: "write", Result: `{"a":1,"a":2}`})
	b, err := json.Marshal(tlog.PortableReceipt{Receipt: r, LeafIndex: 0, Inclusion: []tlog.HexHash{}, Checkpoint: "ex.test/default\n1\n"})
	require.NoError(t, err)
	return string(b)
}

func TestParsePortable(t *testing.T) {
	good := portableJSON(t)
	p, err := tlog.ParsePortable([]byte(good))
	require.NoError(t, err, "a result is opaque: its repeated member is hashed as it is")
	assert.Equal(t, "refund-order-1234", p.Receipt.IdempotencyKey)
	for _, tt := range []struct {
		desc, doc string
	}{
		{"unknown envelope field", strings.Replace(good, `{"receipt"`, `{"x":1,"receipt"`, 1)},
		{"unknown receipt field", strings.Replace(good, `"receipt":{`, `"receipt":{"x":1,`, 1)},
		{"envelope field twice", strings.Replace(good, `{"receipt"`, `{"checkpoint":"","receipt"`, 1)},
		{"receipt field twice", strings.Replace(good, `"receipt":{`, `"receipt":{"seq":1,`, 1)},
		{"trailing data", good + "x"},
		{"two values", good + good},
		{"no receipt", `{"leaf_index":0}`},
		{"not an object", `[1]`},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			_, err := tlog.ParsePortable([]byte(tt.doc))
			assert.ErrorIs(t, err, tlog.ErrPortableForm)
		})
	}
}

func TestReadPortables(t *testing.T) {
	good := portableJSON(t)
	var n int
	count := func([]byte) error { n++; return nil }
	require.NoError(t, tlog.ReadPortables(strings.NewReader(good+"\n"+good+"\n"), count))
	assert.Equal(t, 2, n, "JSON Lines")
	err := tlog.ReadPortables(strings.NewReader(good+"]"), count)
	assert.ErrorIs(t, err, tlog.ErrPortableForm)
	stop := errors.New("stop")
	assert.ErrorIs(t, tlog.ReadPortables(strings.NewReader(good), func([]byte) error { return stop }), stop)
}
