package mcpgate

import (
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
)

// TestForwardMeta: the upstream gets the client's _meta without what only
// the gateway reads, and the call's key as MetaKey, the gateway's alone: a
// key the client put there is replaced, and dropped from a read.
func TestForwardMeta(t *testing.T) {
	t.Parallel()
	client := mcp.Meta{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", MetaIdempotencyKey: "my-key-123",
		metaParamsKey: "p-key-123", MetaKey: "forged", MetaSubjects: []any{"cust-42"}}
	assert.Equal(t, mcp.Meta{"traceparent": client["traceparent"], MetaKey: "dk_1"}, forwardMeta(client, "dk_1"))
	assert.Equal(t, mcp.Meta{"traceparent": client["traceparent"]}, forwardMeta(client, ""), "a read has no key")
	assert.Equal(t, mcp.Meta{MetaKey: "dk_1"}, forwardMeta(nil, "dk_1"))
	assert.Nil(t, forwardMeta(nil, ""))
}
