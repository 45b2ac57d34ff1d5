//lint:file-ignore SA1019 a 2026-07-28 client still answers sampling and roots, as rounds

package test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// parkedClient is a 2026-07-28 agent: it answers elicitations with
// action, samples when sample, and has the root uri; the SDK fulfils
// the rounds itself unless manual.
func parkedClient(action string, sample, manual bool, root string) *mcp.Client {
	o := &mcp.ClientOptions{
		ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: action, Content: map[string]any{}}, nil
		},
	}
	if sample {
		o.CreateMessageHandler = func(context.Context, *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			return &mcp.CreateMessageResult{Role: "assistant", Model: "m", Content: &mcp.TextContent{Text: "model of " + root}}, nil
		}
	}
	if manual {
		o.MultiRoundTrip = &mcp.MultiRoundTripOptions{Disabled: true}
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "e2e-agent", Version: "1"}, o)
	c.AddRoots(&mcp.Root{URI: root})
	return c
}

// TestLedgerMCP_parkedRounds: a 2026-07-28 client in front of an
// upstream of 2025-11-25 whose tools ask their client during the call
// (SPEC §11.1). Such a client is sent no requests, so each request of
// the upstream becomes a round: input_required with the request, the
// upstream's call parked until the client's next round answers it. An
// accepted elicitation runs once (a round not_applied INPUT_REQUIRED,
// then the outcome, one execution) and a repeat is replayed; sampling
// and roots are answered by the client (its roots); a decline is the
// upstream's answer, recorded not_applied, and the same call runs once
// accepted; a client without sampling gets CLIENT_CAPABILITY_MISSING.
func TestLedgerMCP_parkedRounds(t *testing.T) {
	t.Parallel()
	sh := newShop(t)
	upstream := append(sh.command(), "--revision", rev1125)
	for _, transport := range []string{"stdio", "http"} {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			db, args, url := gatewayOn(t, transport, upstream)
			name := func(s string) string { return s + "-" + transport }
			id := func(s string) map[string]any { return map[string]any{"id": name(s)} }
			root := "file:///parked/" + transport
			g := s2cConnect(t, parkedClient("accept", true, false, root), rev2026, url, args)

			assert.Equal(t, "elicited "+name("E")+", run 1", text(t, g.call(t, "ask_elicit", id("E"), nil)))
			rs := toolReceipts(t, db, "test-shop.ask_elicit")
			require.Len(t, rs, 4, "reserve, round, reserve, outcome")
			assert.Equal(t, []string{"reserve", "commit", "reserve", "commit"}, []string{rs[0].Kind, rs[1].Kind, rs[2].Kind, rs[3].Kind})
			assert.Equal(t, "INPUT_REQUIRED", rs[1].ErrorCode)
			assert.Equal(t, rs[0].ExecutionID, rs[2].ExecutionID, "the rounds are one execution")
			assert.Equal(t, 2, rs[2].Attempt)
			assert.Equal(t, "succeeded", rs[3].Outcome)
			again := g.call(t, "ask_elicit", id("E"), nil)
			assert.Equal(t, true, again.Meta["io.effect-ledger/replayed"], again.Meta)
			assert.Equal(t, 1, sh.runs("ask_elicit", name("E")))

			assert.Equal(t, "sampled "+name("S")+": model of "+root+", run 1", text(t, g.call(t, "ask_sample", id("S"), nil)))
			assert.Equal(t, "roots of "+name("R")+": ["+root+"], run 1", text(t, g.call(t, "ask_roots", id("R"), nil)))

			// A decline, then the same call accepted; a client without
			// sampling. (On stdio one gateway at a time holds the ledger.)
			reconnect := func(old *gateway, c *mcp.Client) *gateway {
				if url == "" {
					old.stop(t)
					return s2cConnect(t, c, rev2026, url, args)
				}
				return s2cConnect(t, c, rev2026, url, nil)
			}
			no := reconnect(g, parkedClient("decline", false, false, root))
			res := no.call(t, "ask_elicit", id("D"), nil)
			assert.True(t, res.IsError)
			assert.Contains(t, text(t, res), "the user answered decline")
			rs = toolReceipts(t, db, "test-shop.ask_elicit")
			assert.Equal(t, "not_applied", rs[len(rs)-1].Outcome)
			assert.Equal(t, "TOOL_ERROR", rs[len(rs)-1].ErrorCode)
			assert.Equal(t, 0, sh.runs("ask_elicit", name("D")))
			res = no.call(t, "ask_sample", id("MS"), nil)
			assert.Equal(t, "CLIENT_CAPABILITY_MISSING", status(res), text(t, res))
			assert.Equal(t, 0, sh.runs("ask_sample", name("MS")))
			yes := reconnect(no, parkedClient("accept", true, false, root))
			assert.Equal(t, "elicited "+name("D")+", run 1", text(t, yes.call(t, "ask_elicit", id("D"), nil)))
			verified(t, db)
		})
	}
}

// TestLedgerMCP_parkedAfterRestart: the gateway that parked a call ends
// before the client's next round; the round, sent to a new gateway with
// its answer and requestState, runs the call afresh as the same
// execution (the upstream asks again), and it runs once.
func TestLedgerMCP_parkedAfterRestart(t *testing.T) {
	t.Parallel()
	sh := newShop(t)
	db := filepath.Join(t.TempDir(), "mcp.db")
	args := append([]string{"--db", db}, append(sh.command(), "--revision", rev1125)...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	params := &mcp.CallToolParams{Name: "ask_elicit", Arguments: map[string]any{"id": "X"}}
	first := s2cConnect(t, parkedClient("accept", false, true, "file:///x"), rev2026, "", args)
	res, err := first.CallTool(ctx, params)
	require.NoError(t, err)
	require.True(t, res.NeedsInput(), "%+v", res)
	require.Len(t, res.InputRequests, 1)
	first.stop(t)

	again := s2cConnect(t, parkedClient("accept", false, true, "file:///x"), rev2026, "", args)
	for round := 0; res.NeedsInput(); round++ {
		require.Less(t, round, 3, "rounds without end")
		answers := mcp.InputResponseMap{}
		for k := range res.InputRequests {
			answers[k] = &mcp.ElicitResult{Action: "accept", Content: map[string]any{}}
		}
		params.InputResponses, params.RequestState = answers, res.RequestState
		res, err = again.CallTool(ctx, params)
		require.NoError(t, err, again.logs.String())
	}
	assert.Equal(t, "elicited X, run 1", text(t, res))
	assert.Equal(t, 1, sh.runs("ask_elicit", "X"))
	rs := toolReceipts(t, db, "test-shop.ask_elicit")
	require.NotEmpty(t, rs)
	for _, r := range rs {
		assert.Equal(t, rs[0].ExecutionID, r.ExecutionID, "one execution")
	}
	assert.Equal(t, "succeeded", rs[len(rs)-1].Outcome)
	verified(t, db)
}

// parkOf is the parked call a 2026-07-28 round's requestState names (the
// envelope's "up"), as a client could read it.
func parkOf(t *testing.T, state string) string {
	t.Helper()
	parts := strings.Split(state, ".")
	require.Len(t, parts, 3, state)
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	require.NoError(t, err)
	var e struct {
		Up string `json:"up"`
	}
	require.NoError(t, json.Unmarshal(b, &e))
	require.True(t, strings.HasPrefix(e.Up, "park:"), e.Up)
	return e.Up
}

// TestLedgerMCP_parkedBound: a parked call serves its own call only: a
// read-only tool sent with the parked call's state (which a client can
// read in the envelope) is invalid params and does not answer it. And
// once the upstream had an answer (it saved a draft), its next question
// is a round that records nothing: the execution's reservation stays
// held, an identical call meanwhile is in_progress and runs nothing, and
// the answer to that round commits the call's outcome once.
func TestLedgerMCP_parkedBound(t *testing.T) {
	t.Parallel()
	sh := newShop(t)
	// --wait 0: an identical call is answered in_progress at once.
	db, args, url := gatewayOn(t, "http", append(append([]string{"--wait", "0s"}, sh.command()...), "--revision", rev1125))
	g := s2cConnect(t, parkedClient("accept", false, true, "file:///b"), rev2026, url, args)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	accept := func(res *mcp.CallToolResult) mcp.InputResponseMap {
		out := mcp.InputResponseMap{}
		for k := range res.InputRequests {
			out[k] = &mcp.ElicitResult{Action: "accept", Content: map[string]any{}}
		}
		return out
	}
	params := &mcp.CallToolParams{Name: "ask_twice", Arguments: map[string]any{"id": "T"}}
	res, err := g.CallTool(ctx, params)
	require.NoError(t, err)
	require.True(t, res.NeedsInput())

	_, err = g.CallTool(ctx, &mcp.CallToolParams{Name: "lookup", Arguments: map[string]any{"id": "T"},
		InputResponses: accept(res), RequestState: parkOf(t, res.RequestState)})
	require.Error(t, err, "another tool with the parked call's state")
	assert.Contains(t, err.Error(), "issued for another call")

	params.InputResponses, params.RequestState = accept(res), res.RequestState
	res, err = g.CallTool(ctx, params)
	require.NoError(t, err)
	require.True(t, res.NeedsInput(), "the second question")
	assert.Equal(t, 1, sh.runs("ask_twice_draft", "T"))
	rs := toolReceipts(t, db, "test-shop.ask_twice")
	require.Len(t, rs, 3, "reserve, the first round not_applied, reserve: the second round records nothing")
	assert.Equal(t, "reserve", rs[2].Kind)

	again, err := g.CallTool(ctx, &mcp.CallToolParams{Name: "ask_twice", Arguments: map[string]any{"id": "T"}})
	require.NoError(t, err)
	assert.Equal(t, "in_progress", status(again), "%+v", again)
	assert.Equal(t, 1, sh.runs("ask_twice_draft", "T"), "not run again while its outcome is open")

	// The held round sent twice at once: one runs under the held
	// reservation, the other finds it taken and runs nothing.
	params.InputResponses, params.RequestState = accept(res), res.RequestState
	results := make(chan *mcp.CallToolResult, 2)
	for range 2 {
		round := *params // the SDK writes a call's _meta into its params
		round.Meta = nil
		go func() {
			r, err := g.CallTool(ctx, &round)
			if err != nil {
				r = &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}}
			}
			results <- r
		}()
	}
	a, b := <-results, <-results
	if a.IsError {
		a, b = b, a
	}
	assert.Equal(t, "sent T, run 1", text(t, a))
	assert.Equal(t, "in_progress", status(b), text(t, b))
	assert.Equal(t, 1, sh.runs("ask_twice", "T"))
	rs = toolReceipts(t, db, "test-shop.ask_twice")
	require.Len(t, rs, 4)
	assert.Equal(t, "succeeded", rs[3].Outcome)
	assert.Equal(t, 2, rs[3].Attempt, "committed with the held reservation")
	verified(t, db)
}

// TestLedgerMCP_parkedHeldAtStop: a gateway that stops while a parked
// call holds its reservation (the upstream had an answer and asked
// again) answers the question with an error and commits the upstream's
// final answer before its ledger closes: the key is not left reserved.
func TestLedgerMCP_parkedHeldAtStop(t *testing.T) {
	t.Parallel()
	sh := newShop(t)
	db, args, _ := gatewayOn(t, "stdio", append(sh.command(), "--revision", rev1125))
	g := s2cConnect(t, parkedClient("accept", false, true, "file:///s"), rev2026, "", args)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res := heldTwice(ctx, t, g, "S")
	require.True(t, res.NeedsInput())
	g.stop(t)

	rs := toolReceipts(t, db, "test-shop.ask_twice")
	require.NotEmpty(t, rs)
	last := rs[len(rs)-1]
	assert.Equal(t, "commit", last.Kind, "the held reservation was committed: %+v", rs)
	assert.Equal(t, "TOOL_ERROR", last.ErrorCode, "the upstream's answer: draft kept, not sent")
	assert.Equal(t, 1, sh.runs("ask_twice_draft", "S"))
	assert.Equal(t, 0, sh.runs("ask_twice", "S"))
	verified(t, db)
}

// TestLedgerMCP_parkedHeldLease: a parked call that holds its
// execution's reservation gives up before that reservation's lease ends
// (its question answered with an error) and commits the upstream's final
// answer with it ("draft kept, not sent": a tool error, recorded
// not_applied by default): an identical call afterwards runs again, not
// a key left for a person.
func TestLedgerMCP_parkedHeldLease(t *testing.T) {
	t.Parallel()
	sh := newShop(t)
	db, args, url := gatewayOn(t, "http", append(append([]string{"--lease", "2s", "--wait", "0s"}, sh.command()...), "--revision", rev1125))
	g := s2cConnect(t, parkedClient("accept", false, true, "file:///l"), rev2026, url, args)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res := heldTwice(ctx, t, g, "L")
	require.True(t, res.NeedsInput(), "held")
	require.Eventually(t, func() bool {
		rs := toolReceipts(t, db, "test-shop.ask_twice")
		return len(rs) == 4 && rs[3].Kind == "commit"
	}, 20*time.Second, 50*time.Millisecond, "the held reservation committed before its lease ends")
	rs := toolReceipts(t, db, "test-shop.ask_twice")
	assert.Equal(t, "TOOL_ERROR", rs[3].ErrorCode)
	assert.Equal(t, 2, rs[3].Attempt, "committed with the held reservation")
	again, err := g.CallTool(ctx, &mcp.CallToolParams{Name: "ask_twice", Arguments: map[string]any{"id": "L"}})
	require.NoError(t, err)
	assert.True(t, again.NeedsInput(), "runs again, asking first: %+v", again)
	assert.Equal(t, 1, sh.runs("ask_twice_draft", "L"))
	verified(t, db)
}

// TestLedgerMCP_upstreamStateNotPark: a 2026-07-28 upstream's own
// requestState is opaque, whatever it looks like: a round whose state
// ends like a held parked round's is still committed not_applied
// INPUT_REQUIRED (no call is parked for an upstream that has rounds of
// its own).
func TestLedgerMCP_upstreamStateNotPark(t *testing.T) {
	t.Parallel()
	sh := newShop(t)
	db := filepath.Join(t.TempDir(), "mcp.db")
	g := startGatewayRev(t, rev2026, clientOptions(nil), append([]string{"--db", db}, sh.command()...)...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := g.CallTool(ctx, &mcp.CallToolParams{Name: "confirm", Arguments: map[string]any{"id": "X:held"}})
	require.NoError(t, err)
	require.True(t, res.NeedsInput())
	rs := toolReceipts(t, db, "test-shop.confirm")
	require.Len(t, rs, 2, "%+v", rs)
	assert.Equal(t, "INPUT_REQUIRED", rs[1].ErrorCode)
}

// heldTwice calls ask_twice with id and accepts its first question: the
// upstream saves a draft and asks again, a round whose parked call holds
// the execution's reservation.
func heldTwice(ctx context.Context, t *testing.T, g *gateway, id string) *mcp.CallToolResult {
	t.Helper()
	params := &mcp.CallToolParams{Name: "ask_twice", Arguments: map[string]any{"id": id}}
	res, err := g.CallTool(ctx, params)
	require.NoError(t, err)
	params.InputResponses = mcp.InputResponseMap{}
	for k := range res.InputRequests {
		params.InputResponses[k] = &mcp.ElicitResult{Action: "accept", Content: map[string]any{}}
	}
	params.RequestState = res.RequestState
	res, err = g.CallTool(ctx, params)
	require.NoError(t, err)
	return res
}
