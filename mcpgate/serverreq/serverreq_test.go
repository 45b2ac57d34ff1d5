//lint:file-ignore SA1019 roots are deprecated (SEP-2577), not gone

package serverreq

import (
	"context"
	"errors"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
)

// TestMissingCapability: a call whose first server→client request could
// not be forwarded applied nothing; one that had already had an answer
// may have acted (unknown); a success or a call with no refusal is left
// as it is.
func TestMissingCapability(t *testing.T) {
	p := &Peer{}
	const failed = true // a failure the upstream gave (a TOOL_ERROR)

	r := &Route{ctx: context.Background()}
	p.markMissing(r, ErrCapabilityMissing)
	first, err := MissingCapability(p, r, failed, "")
	assert.True(t, first)
	assert.True(t, errors.Is(err, ErrCapabilityMissing))
	_, err = MissingCapability(p, r, false, "")
	assert.NoError(t, err, "a success stays one")

	r = &Route{ctx: context.Background(), answered: 1}
	p.markMissing(r, ErrCapabilityMissing)
	first, err = MissingCapability(p, r, failed, "")
	assert.False(t, first, "the upstream had an answer before: it may have acted")
	assert.Error(t, err)

	_, err = MissingCapability(nil, nil, failed, "")
	assert.NoError(t, err)
}

// TestRelayable: only the capabilities the gateway relays, and roots
// only when the client has them (never the SDK's default).
func TestRelayable(t *testing.T) {
	none := Relayable(&mcp.ClientCapabilities{})
	assert.Nil(t, none.RootsV2)
	assert.Nil(t, none.Elicitation)
	assert.Nil(t, none.Sampling)
	all := Relayable(&mcp.ClientCapabilities{RootsV2: &mcp.RootCapabilities{ListChanged: true},
		Elicitation: &mcp.ElicitationCapabilities{}, Sampling: &mcp.SamplingCapabilities{},
		Experimental: map[string]any{"x": map[string]any{}}})
	assert.Equal(t, &mcp.RootCapabilities{ListChanged: true}, all.RootsV2)
	assert.NotNil(t, all.Elicitation)
	assert.NotNil(t, all.Sampling)
	assert.Nil(t, all.Experimental)
}
