package downstream

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/mcpgate/tasks"
)

// params.task rides in _meta from the client's transport to the
// upstream's and comes out as it went in.
func TestTaskParamsRoundTrip(t *testing.T) {
	in := json.RawMessage(`{"name":"job","arguments":{"id":"t1"},"task":{"ttl":60000},"_meta":{"progressToken":7}}`)
	lifted := liftParamsKey(in)
	var p struct {
		Task json.RawMessage `json:"task"`
		Meta mcp.Meta        `json:"_meta"`
	}
	require.NoError(t, json.Unmarshal(lifted, &p))
	assert.Nil(t, p.Task, "lifted out of params")
	assert.Equal(t, map[string]any{"ttl": float64(60000)}, p.Meta[tasks.MetaParamsTask])
	assert.Equal(t, time.Minute, tasks.Lease(p.Meta, 5*time.Minute))

	out := tasks.UnliftParams(lifted)
	assert.JSONEq(t, string(in), string(out))
	plain := json.RawMessage(`{"name":"job","arguments":{}}`)
	assert.Equal(t, plain, tasks.UnliftParams(plain))
}

// A _meta of null is no _meta: the key is lifted into a new one.
func TestLiftParamsKey_nullMeta(t *testing.T) {
	lifted := liftParamsKey(json.RawMessage(`{"name":"job","idempotencyKey":"k-0001","_meta":null}`))
	assert.JSONEq(t, `{"name":"job","_meta":{"`+MetaParamsKey+`":"k-0001"}}`, string(lifted))
}
