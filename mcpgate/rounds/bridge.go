//lint:file-ignore SA1019 sampling and roots are deprecated (SEP-2577), not gone: a client that has them is asked

package rounds

import (
	"context"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/mcpgate/ledgerport"
	"github.com/effect-ledger/effect-ledger/mcpgate/serverreq"
)

// A client of a revision before 2026-07-28 cannot answer input_required:
// the gateway asks it instead with the server→client request of its
// revision (elicitation/create, sampling/createMessage, roots/list), on
// the session that made the call, and sends the call again with the
// answers. Each round is one attempt of the call's execution, committed
// not_applied INPUT_REQUIRED like a 2026-07-28 client's.

// MaxBridgedRounds bounds the rounds of one call the gateway asks for an
// older client (the SDK's client allows as many).
const MaxBridgedRounds = 10

// Fulfil asks the client each input request of a round, with ctx of the
// client's request (over HTTP, the request goes on its stream).
func Fulfil(ctx context.Context, ss *mcp.ServerSession, reqs mcp.InputRequestMap) (mcp.InputResponseMap, error) {
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
				return nil, fmt.Errorf("%w: elicitation", serverreq.ErrCapabilityMissing)
			}
			res, err = ss.Elicit(ctx, p)
		case *mcp.CreateMessageWithToolsParams:
			if caps.Sampling == nil {
				return nil, fmt.Errorf("%w: sampling", serverreq.ErrCapabilityMissing)
			}
			res, err = ss.CreateMessageWithTools(ctx, p)
		case *mcp.ListRootsParams:
			if !serverreq.HasRoots(caps) {
				return nil, fmt.Errorf("%w: roots", serverreq.ErrCapabilityMissing)
			}
			res, err = ss.ListRoots(ctx, p)
		default:
			return nil, fmt.Errorf("%w: input request %q of type %T", serverreq.ErrCapabilityMissing, id, r)
		}
		if err != nil {
			return nil, fmt.Errorf("ask the client (%s): %w", id, err)
		}
		out[id] = res
	}
	return out, nil
}

// CapabilityMissing is the outcome of a call whose input the client
// cannot give: nothing was applied, and nothing was attempted.
func CapabilityMissing(err error) ledgerport.Outcome {
	return ledgerport.Outcome{NotApplied: true, ErrorCode: ledger.CodeClientCapabilityMissing, ErrorMessage: ledgerport.Truncate(err.Error(), ledgerport.MaxFailureMessage)}
}
