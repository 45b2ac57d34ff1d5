package mcpgate

import "github.com/effect-ledger/effect-ledger/internal/metrics"

// Decisions, the values of the decision label.
const (
	DecisionExecuted = "executed"
	DecisionReplayed = "replayed"
	DecisionRefused  = "refused"
	DecisionPassed   = "passed_through"
	DecisionUnknown  = "unknown"
)

// unlistedToolLabel is the tool label of calls of tools the upstream
// does not list.
const unlistedToolLabel = "(unlisted)"

// callsTotal counts tools/call requests by the ledger's tool name and
// what the gateway did. The tool label takes only names the upstream
// lists, so a client cannot grow it without bound.
var callsTotal = metrics.CounterVec("ledger_mcp_calls_total",
	"tools/call requests through ledger-mcp by tool and decision (executed, replayed, refused, passed_through, unknown).", "tool", "decision")

// Answers of a lookup (SPEC §15), the values of lookupsTotal's answer
// label: evidence the call applied, that it did not, or neither.
const (
	LookupApplied    = "applied"
	LookupNotApplied = "not_applied"
	LookupNone       = "none"
)

// lookupsTotal counts the lookups asked about interrupted calls, by the
// ledger's name of the interrupted tool and what the answer was worth.
var lookupsTotal = metrics.CounterVec("ledger_mcp_lookups_total",
	"lookups ledger-mcp asked about interrupted calls, by tool and answer (applied, not_applied, none).", "tool", "answer")
