package rounds_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/mcpgate/rounds"
	"github.com/effect-ledger/effect-ledger/mcpgate/serverreq"
	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
)

// TestParking_round: a request of the upstream during a parked call
// becomes the client's input_required round; the round's state names the
// parked call, which only the same call (tool, arguments, recorded) takes,
// once; the client's answer goes to the upstream, and the call's final
// answer ends it.
func TestParking_round(t *testing.T) {
	ctx := context.Background()
	pk := rounds.NewParking(nil, time.Minute, slog.New(slog.DiscardHandler))
	p := rounds.NewParked(nil, &serverreq.Route{}, "shop.charge", "h1", true, "stdio", &wire.Slot{}, func() {})
	asked := make(chan mcp.Result, 1)
	go func() {
		res, err := p.Ask(ctx, &mcp.ElicitParams{Message: "Charge the card?"})
		assert.NoError(t, err)
		asked <- res
	}()

	res, slot, err := pk.Await(ctx, rounds.Round{Tool: "shop.charge"}, p)
	require.NoError(t, err)
	var round struct {
		ResultType    string         `json:"resultType"`
		InputRequests map[string]any `json:"inputRequests"`
	}
	require.NoError(t, json.Unmarshal(slot.Get(), &round))
	assert.Equal(t, "input_required", round.ResultType)
	id, question, held, ok := rounds.ParsePark(res.RequestState)
	require.True(t, ok, res.RequestState)
	assert.False(t, held, "the upstream had no answer yet: nothing held")
	assert.Contains(t, round.InputRequests, question)

	_, bound := pk.Take(id, question, "shop.refund", true, "h1")
	assert.True(t, bound, "another tool's call")
	_, bound = pk.Take(id, question, "shop.charge", true, "h2")
	assert.True(t, bound, "other arguments")
	got, bound := pk.Take(id, question, "shop.charge", true, "h1")
	require.Same(t, p, got)
	assert.False(t, bound)
	again, _ := pk.Take(id, question, "shop.charge", true, "h1")
	assert.Nil(t, again, "taken once")

	got.Answer(mcp.InputResponseMap{question: &mcp.ElicitResult{Action: "accept"}})
	answer := <-asked
	require.IsType(t, &mcp.ElicitResult{}, answer)
	assert.Equal(t, "accept", answer.(*mcp.ElicitResult).Action)

	final := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "charged"}}}
	p.Done(rounds.End{Res: final, Slot: &wire.Slot{}})
	res, _, err = pk.Await(ctx, rounds.Round{Tool: "shop.charge"}, p)
	require.NoError(t, err)
	assert.Same(t, final, res)
}
