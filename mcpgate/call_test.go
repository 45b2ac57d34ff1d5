package mcpgate

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// TestReserveOf_input: a round's reserve carries the arguments as its
// input and no fingerprint beside them (the ledger refuses both), and
// arguments too large for an ask as their fingerprint only.
func TestReserveOf_input(t *testing.T) {
	t.Parallel()
	g := &Gateway{}
	c := &call{request: request{name: "charge", ledgerTool: "shop.charge", args: json.RawMessage(`{ "amount": 12 }`)}, hash: "h"}
	r := g.reserveOf(c, "key-1")
	assert.JSONEq(t, `{"amount":12}`, string(r.Input))
	assert.Empty(t, r.InputHash)

	big := make([]byte, ledger.MaxAskInput+16)
	for i := range big {
		big[i] = 'x'
	}
	c.args = json.RawMessage(`"` + string(big) + `"`)
	r = g.reserveOf(c, "key-1")
	assert.Empty(t, r.Input)
	assert.Equal(t, "h", r.InputHash)
}
