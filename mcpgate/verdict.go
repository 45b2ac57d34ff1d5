package mcpgate

import (
	"encoding/json"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/mcpgate/ledgerport"
	"github.com/effect-ledger/effect-ledger/mcpgate/tasks"
	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
)

// Outcome is what a forwarded call came to, as the ledger records it.
type Outcome = ledgerport.Outcome

// verdict is what an upstream's answer to a forwarded call came to.
type verdict struct {
	known   bool    // the upstream answered: the outcome is known
	outcome Outcome // known: what is recorded
	// inputRequired: the upstream asked for input (SPEC §11.1); nothing
	// was applied, and the next round continues the execution.
	inputRequired bool
	reply         mcp.Result
	rpcErr        *jsonrpc.Error // the upstream's JSON-RPC error, passed on as it came
	// taskID: the call answered a task (tasks.go), task as it came; its
	// outcome is the task's terminal status.
	taskID string
	task   json.RawMessage
	// unsent: no answer, and the request never went to the upstream's
	// connection (the SDK refused it first: "client is closing"), so the
	// upstream cannot have acted on it.
	unsent bool
	// strays: ids of answers that matched no request, seen while the
	// call waited (an upstream that answers with a wrong id).
	strays []any
}

// judge reads an upstream's answer. Only an answer the upstream sent is
// an outcome (SPEC §11): the SDK reports a connection that dropped, or an
// HTTP 5xx, as a JSON-RPC error too, and those leave the outcome unknown.
// An answer the SDK could not decode (a number out of range, an unknown
// content type) is still the upstream's answer, read from its text.
func judge(res *mcp.CallToolResult, slot *wire.Slot, err error) verdict {
	raw := slot.Get()
	rpcErr, answered := slot.Answer()
	if id, task, ok := tasks.Of(raw); err == nil && ok {
		return verdict{known: true, taskID: id, task: task, reply: wire.AsRaw(res, raw)}
	}
	switch {
	case err == nil && res.NeedsInput():
		return verdict{known: true, inputRequired: true, reply: wire.AsRaw(res, raw), outcome: Outcome{NotApplied: true,
			ErrorCode: ledger.CodeInputRequired, ErrorMessage: "the call asked the client for input"}}
	case err == nil && !res.IsError:
		return verdict{known: true, outcome: Outcome{Succeeded: true, Result: recordedResult(res, raw)}, reply: wire.AsRaw(res, raw)}
	case err == nil:
		return verdict{known: true, outcome: toolError(firstText(res)), reply: wire.AsRaw(res, raw)}
	case rpcErr != nil:
		return verdict{known: true, outcome: rpcFailure(rpcErr.Message), rpcErr: rpcErr}
	case answered && len(raw) > 0:
		return judgeRaw(raw)
	case err != nil && !slot.WasWritten():
		return verdict{unsent: true}
	}
	return verdict{strays: slot.StrayIDs()}
}

// judgeRaw reads a result the SDK could not decode from its text.
func judgeRaw(raw json.RawMessage) verdict {
	var loose struct {
		IsError bool `json:"isError"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	}
	if json.Unmarshal(raw, &loose) != nil {
		// Not even an object with content: record what came, noted.
		return verdict{known: true, outcome: Outcome{Succeeded: true,
			Result: ledgerport.ResultNote("The call's answer could not be read, so it is not replayed.")}, reply: wire.RawCall(&mcp.CallToolResult{}, raw)}
	}
	reply := wire.RawCall(&mcp.CallToolResult{IsError: loose.IsError}, raw)
	if loose.IsError {
		var first string
		for _, c := range loose.Content {
			if c.Type == "text" {
				first = c.Text
				break
			}
		}
		return verdict{known: true, outcome: toolError(first), reply: reply}
	}
	return verdict{known: true, outcome: Outcome{Succeeded: true, Result: recordedResult(&mcp.CallToolResult{}, raw)}, reply: reply}
}

// finalOutcome is what an upstream's final answer came to (a task's
// end): its result, or (failure != "") the error it failed with.
func finalOutcome(result json.RawMessage, failure string) Outcome {
	if failure != "" {
		return rpcFailure(failure)
	}
	var res mcp.CallToolResult
	if err := json.Unmarshal(result, &res); err == nil && res.IsError {
		return toolError(firstText(&res))
	}
	return Outcome{Succeeded: true, Result: recordedResult(&res, result)}
}

// rpcFailure is the outcome of an answer with a JSON-RPC error.
func rpcFailure(message string) Outcome {
	return Outcome{ErrorCode: CodeMCPError, ErrorMessage: ledgerport.Truncate(message, ledgerport.MaxFailureMessage)}
}

// toolError is the outcome of an answer with isError: true.
func toolError(text string) Outcome {
	return Outcome{ErrorCode: CodeToolError, ErrorMessage: ledgerport.Truncate(text, ledgerport.MaxFailureMessage)}
}
