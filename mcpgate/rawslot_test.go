package mcpgate

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
)

// TestRawSlot_abandoned: once the wait for an answer has ended (the
// upstream timeout or the lease), an answer that comes after it — it may
// be the upstream's answer to the cancellation the gateway sent, "context
// canceled" — is not taken, so the call's outcome stays unknown instead
// of being recorded from it.
func TestRawSlot_abandoned(t *testing.T) {
	_, s := wire.WithSlot(context.Background())
	s.Abandon()
	s.Put(json.RawMessage(`{"content":[{"type":"text","text":"context canceled"}],"isError":true}`), nil)
	_, answered := s.Answer()
	assert.False(t, answered)
	assert.Nil(t, s.Get())
	v := judge(nil, s, context.Canceled)
	assert.False(t, v.known, "no outcome from an answer after the wait")
}
