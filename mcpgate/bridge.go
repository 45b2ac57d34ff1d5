//lint:file-ignore SA1019 sampling and roots are deprecated (SEP-2577), not gone: a client that has them is asked

package mcpgate

import (
	"context"
	"errors"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// A client of a revision before 2026-07-28 cannot answer input_required:
// the gateway asks it instead with the server→client request of its
// revision (elicitation/create, sampling/createMessage, roots/list), on
// the session that made the call, and sends the call again with the
// answers (SPEC §11.1). Each round is one attempt of the call's
// execution, committed not_applied INPUT_REQUIRED like a 2026-07-28
// client's.

// maxBridgedRounds bounds the rounds of one call the gateway asks for an
// older client (the SDK's client allows as many).
const maxBridgedRounds = 10

// errCapabilityMissing is an input request the client cannot answer: it
// did not declare the capability.
var errCapabilityMissing = errors.New("the client lacks the capability")

// bridges reports whether the gateway asks the client for a round's
// input itself.
func (c *call) bridges() bool { return !statelessRevision(c.version) && c.session != nil }

// fulfil asks the client each input request of a round, with ctx of the
// client's request (over HTTP, the request goes on its stream).
func fulfil(ctx context.Context, ss *mcp.ServerSession, reqs mcp.InputRequestMap) (mcp.InputResponseMap, error) {
	caps := &mcp.ClientCapabilities{}
	if ip := ss.InitializeParams(); ip != nil && ip.Capabilities != nil {
		caps = ip.Capabilities
	}
	out := mcp.InputResponseMap{}
	for id, r := range reqs {
		var (
			res mcp.InputResponse
			err error
		)
		switch p := r.(type) {
		case *mcp.ElicitParams:
			if caps.Elicitation == nil {
				return nil, fmt.Errorf("%w: elicitation", errCapabilityMissing)
			}
			res, err = ss.Elicit(ctx, p)
		case *mcp.CreateMessageWithToolsParams:
			if caps.Sampling == nil {
				return nil, fmt.Errorf("%w: sampling", errCapabilityMissing)
			}
			res, err = ss.CreateMessageWithTools(ctx, p)
		case *mcp.ListRootsParams:
			if !hasRoots(caps) {
				return nil, fmt.Errorf("%w: roots", errCapabilityMissing)
			}
			res, err = ss.ListRoots(ctx, p)
		default:
			return nil, fmt.Errorf("%w: input request %q of type %T", errCapabilityMissing, id, r)
		}
		if err != nil {
			return nil, fmt.Errorf("ask the client (%s): %w", id, err)
		}
		out[id] = res
	}
	return out, nil
}

// hasRoots reports whether a client declared roots, as far as the SDK
// lets a server tell (see wireCapabilities).
func hasRoots(c *mcp.ClientCapabilities) bool {
	_, ok := wireCapabilities(c)["roots"]
	return ok
}

// capabilityMissing is the outcome of a call whose input the client
// cannot give: nothing was applied, and nothing was attempted.
func capabilityMissing(err error) Outcome {
	return Outcome{NotApplied: true, ErrorCode: ledger.CodeClientCapabilityMissing, ErrorMessage: truncate(err.Error(), maxFailureMessage)}
}

// capabilityAnswer tells the model that the call needs what its client
// cannot give.
func capabilityAnswer(key string, err error) *mcp.CallToolResult {
	return answer(ledger.CodeClientCapabilityMissing, key, fmt.Sprintf("This call was not run: the tool asked for input "+
		"this client cannot give (%v). Nothing was applied (idempotency key %s).", err, key))
}
