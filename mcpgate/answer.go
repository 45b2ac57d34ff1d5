package mcpgate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/mcpgate/ledgerport"
	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
)

// Statuses the gateway puts in _meta["io.effect-ledger/status"] of the
// answers it makes itself, besides the ledger's refusal codes.
const (
	StatusLedgerUnavailable = "ledger_unavailable"
	StatusOutcomeUnknown    = "outcome_unknown"
)

// answer is a CallToolResult the gateway makes itself: an error the model
// reads as text, with the status and key in _meta.
func answer(status, key, text string) *mcp.CallToolResult {
	meta := mcp.Meta{MetaStatus: status}
	if key != "" {
		meta[MetaKey] = key
	}
	return &mcp.CallToolResult{IsError: true, Meta: meta, Content: []mcp.Content{&mcp.TextContent{Text: text}}}
}

// refusalAnswer tells the model why the ledger refused a call (SPEC §11's
// table), in words that say what to do next.
func refusalAnswer(r *ledgerport.Refusal, key, adminURL string) *mcp.CallToolResult {
	var text string
	switch r.Code {
	case "retry_not_allowed":
		text = fmt.Sprintf("This exact call already ran and failed%s, and that failure may have left something behind, "+
			"so it is not run again automatically (idempotency key %s). Tell the user: a person who checks that nothing "+
			"was applied can mark it so (%s), and then the same call runs again.",
			recordedFailure(r.Details), key, resolveHow(key, adminURL, "not_applied --error-code CODE"))
	case "in_progress":
		text = fmt.Sprintf("The same call is still running (idempotency key %s), so it was not started a second time. "+
			"Call again later to get its result.", key)
	case "unsafe_resume":
		text = fmt.Sprintf("An earlier identical call was interrupted and its outcome is unknown: it may or may not have taken effect. "+
			"It will not be run again until a person checks and resolves the key: %s.",
			resolveHow(key, adminURL, "succeeded|failed|not_applied"))
	case "fingerprint_mismatch":
		text = fmt.Sprintf("The idempotency key %s was already used for a different call (another tool or other arguments), "+
			"so this call was not run. Use a new key for a new call.", key)
	case ledger.ECodeDeniedByPolicy:
		text = fmt.Sprintf("The effect ledger's policy denies this tool%s, so this call was NOT run, and it will not run "+
			"however often it is made. Do not retry it; tell the user if it is needed (idempotency key %s).", deniedRule(r.Details), key)
	case ledger.ECodeApprovalRejected:
		text = fmt.Sprintf("A person rejected this call%s, so it was NOT run, and the same call stays rejected. "+
			"Do not retry it unchanged; tell the user (idempotency key %s).", rejection(r.Details), key)
	case ledger.ECodeUnchangedRetry:
		text = fmt.Sprintf("This same call failed recently%s and nothing about it changed, so the effect ledger's policy "+
			"refuses to run it again unchanged: it was NOT run. Fix what made it fail (change its arguments), or tell the "+
			"user (idempotency key %s).", unchangedFailure(r.Details), key)
	default:
		text = fmt.Sprintf("The effect ledger refused this call (%s: %s), so it was not run (idempotency key %s).", r.Code, r.Message, key)
	}
	return answer(r.Code, key, text)
}

// deniedRule names the policy rule of a denied_by_policy.
func deniedRule(details map[string]any) string {
	if tool, ok := details["tool"].(string); ok && tool != "" {
		return fmt.Sprintf(" (rule %q)", tool)
	}
	return ""
}

// rejection renders who rejected a call, and why, from the details of an
// approval_rejected.
func rejection(details map[string]any) string {
	a, _ := details["approval"].(map[string]any)
	var parts []string
	if seq, ok := a["ask_seq"].(float64); ok {
		parts = append(parts, fmt.Sprintf("approval request %d", uint64(seq)))
	} else if seq, ok := a["ask_seq"].(uint64); ok {
		parts = append(parts, fmt.Sprintf("approval request %d", seq))
	}
	if actor, ok := a["actor"].(string); ok && actor != "" {
		parts = append(parts, "by "+actor)
	}
	if note, ok := a["note"].(string); ok && note != "" {
		parts = append(parts, fmt.Sprintf("note: %q", note))
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// unchangedFailure renders the failure an unchanged_retry names.
func unchangedFailure(details map[string]any) string {
	f, _ := details["failed"].(map[string]any)
	code, _ := f["error_code"].(string)
	msg, _ := f["error_message"].(string)
	return failureNote(code, msg)
}

// failureNote renders a recorded failure's code and message, as the
// answer names them: " (CODE: message)", " (CODE)", or "" without a code.
func failureNote(code, msg string) string {
	switch {
	case code != "" && msg != "":
		return fmt.Sprintf(" (%s: %s)", code, msg)
	case code != "":
		return fmt.Sprintf(" (%s)", code)
	}
	return ""
}

// resolveHow says how a person resolves key: with ledgerctl and an
// admin token against the server that serves the ledger (adminURL), or,
// unknown, against a ledgerd. Where the admin token is kept is not said:
// the text goes to the model, and the token must not reach the agent.
func resolveHow(key, adminURL, outcomes string) string {
	server := "--server URL"
	if adminURL != "" {
		server = "--server " + adminURL
	}
	s := fmt.Sprintf("LEDGER_TOKEN=<admin token> ledgerctl resolve %s %s --outcome %s --note '…'", key, server, outcomes)
	if adminURL != "" {
		s += fmt.Sprintf(", or the page %s/ui/", adminURL)
	}
	return s
}

// recordedFailure renders the recorded failure of a retry_not_allowed.
func recordedFailure(details map[string]any) string {
	var code, msg string
	for _, v := range []any{details, details["error"], details["failure"]} {
		m, ok := v.(map[string]any)
		if !ok {
			continue
		}
		if c, ok := m["error_code"].(string); ok && code == "" {
			code = c
		}
		if c, ok := m["code"].(string); ok && code == "" {
			code = c
		}
		if s, ok := m["error_message"].(string); ok && msg == "" {
			msg = s
		}
		if s, ok := m["message"].(string); ok && msg == "" {
			msg = s
		}
	}
	return failureNote(code, msg)
}

func unavailableAnswer(key string) *mcp.CallToolResult {
	return answer(StatusLedgerUnavailable, key, "The effect ledger cannot be reached or written, so this call was not run: "+
		"an effect is never run unrecorded. Try again later.")
}

func unknownAnswer(key string, err error) *mcp.CallToolResult {
	return answer(StatusOutcomeUnknown, key, fmt.Sprintf("The tool server did not answer this call (%v): "+
		"it may or may not have taken effect. Do not assume either. An identical call is not run again blindly: "+
		"an idempotent tool is taken over once the reservation ends, any other waits for a person to resolve idempotency key %s.", err, key))
}

// replayNotice is the text block that starts a replayed answer: what the
// model is told so that it does not take a recorded answer for a new run.
// An outcome a person resolved (ledgerctl resolve) did not run here: the
// notice says who decided and when, with their note and external_ref,
// and points below only at a result that was recorded. One the gateway
// reconciled by its lookup (SPEC §15) says so, with the external_ref the
// lookup found.
func replayNotice(rsv *ledgerport.Reservation, rec ledgerport.Record, sessionScope bool) string {
	when := ""
	if !rec.At.IsZero() {
		when = " at " + rec.At.Format(time.RFC3339)
	}
	again := "change its arguments"
	if sessionScope {
		again += " or call it in a new session"
	}
	if !rec.Expires.IsZero() {
		again += fmt.Sprintf(", or call it after %s, when the ledger forgets this one", rec.Expires.Format(time.RFC3339))
	}
	below := "below is the answer recorded then"
	erased, wasErased := rsv.Erased[erasedResult]
	switch {
	case wasErased:
		below = fmt.Sprintf("its recorded answer was erased (erase receipt %d: the ledger no longer holds it), so none follows", erased)
	case !hasContent(rsv.Result):
		below = "no answer of the tool was recorded, so none follows"
	}
	ran := fmt.Sprintf("this exact call already ran%s (receipt %d) and was NOT run again; %s", when, rsv.Original.Seq, below)
	if rec.Kind == chain.KindResolve {
		by := "a person"
		if rec.Actor != "" {
			by += fmt.Sprintf(" (%s)", rec.Actor)
		}
		ran = fmt.Sprintf("this exact call was NOT run again. An earlier run of it ended with no recorded answer, and "+
			"%s resolved its outcome as succeeded%s (receipt %d)", by, when, rsv.Original.Seq)
		if rec.ExternalRef != "" {
			ran += fmt.Sprintf(", external reference %q", rec.ExternalRef)
		}
		if rec.Note != "" {
			ran += fmt.Sprintf(", with the note %q", rec.Note)
		}
		switch {
		case wasErased:
			ran += fmt.Sprintf("; the result recorded with that decision was erased (erase receipt %d), so none follows", erased)
		case hasContent(rsv.Result):
			ran += "; below is the result recorded with that decision"
		default:
			ran += "; no answer of the tool was recorded, so none follows"
		}
	}
	if rec.Kind == chain.KindReconcile {
		ran = fmt.Sprintf("this exact call was NOT run again. An earlier run of it was interrupted with no recorded answer; "+
			"the tool server's read-only lookup found that it applied, so its outcome was reconciled as succeeded%s "+
			"(receipt %d), external reference %q, not re-run", when, rsv.Original.Seq, rec.ExternalRef)
	}
	return fmt.Sprintf("[Replayed: %s. If the world may have changed since and you mean to do it again, "+
		"%s, or tell the user. Idempotency key %s.]", ran, again, rsv.Key)
}

// erasedResult is the name of the result field in a replay's erased
// object (SPEC §14).
const erasedResult = "result"

// hasContent reports whether a recorded result has content blocks.
func hasContent(result json.RawMessage) bool {
	var r struct {
		Content           []json.RawMessage `json:"content"`
		StructuredContent json.RawMessage   `json:"structuredContent"`
	}
	return json.Unmarshal(result, &r) == nil && (len(r.Content) > 0 || len(r.StructuredContent) > 0)
}

// replayAnswer is the recorded CallToolResult of a key that succeeded,
// as it was recorded, with _meta marking it replayed and naming the
// receipt the replay appended; a non-empty notice goes before its content
// as a text block.
func replayAnswer(rsv *ledgerport.Reservation, notice string) (mcp.Result, error) {
	obj := map[string]json.RawMessage{}
	if len(rsv.Result) > 0 {
		if err := json.Unmarshal(rsv.Result, &obj); err != nil {
			return nil, fmt.Errorf("replay %s: recorded result: %w", rsv.Key, err)
		}
	}
	if obj["content"] == nil {
		obj["content"] = json.RawMessage("[]")
	}
	if notice != "" {
		var content []json.RawMessage
		if err := json.Unmarshal(obj["content"], &content); err != nil {
			return nil, fmt.Errorf("replay %s: recorded content: %w", rsv.Key, err)
		}
		block, err := json.Marshal(&mcp.TextContent{Text: notice})
		if err != nil {
			return nil, fmt.Errorf("replay %s: %w", rsv.Key, err)
		}
		b, err := json.Marshal(append([]json.RawMessage{block}, content...))
		if err != nil {
			return nil, fmt.Errorf("replay %s: %w", rsv.Key, err)
		}
		obj["content"] = b
	}
	meta := map[string]any{}
	if m := obj["_meta"]; m != nil {
		_ = json.Unmarshal(m, &meta)
	}
	meta[MetaReplayed] = true
	meta[MetaReceipt] = rsv.Receipt
	meta[MetaKey] = rsv.Key
	if len(rsv.Erased) > 0 {
		meta[MetaErased] = rsv.Erased
	}
	b, err := json.Marshal(meta)
	if err != nil {
		return nil, fmt.Errorf("replay %s: %w", rsv.Key, err)
	}
	obj["_meta"] = b
	raw, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("replay %s: %w", rsv.Key, err)
	}
	res := &mcp.CallToolResult{}
	if err := json.Unmarshal(raw, res); err != nil {
		return nil, fmt.Errorf("replay %s: recorded result: %w", rsv.Key, err)
	}
	return wire.RawCall(res, raw), nil
}

// maxResult is the ledger's bound on a recorded result (SPEC §4).
const maxResult = 64 << 10

// recordedResult is what a commit records of a CallToolResult: its
// content and structuredContent, from the upstream's own text when the
// connection kept it. A result the ledger cannot hold is recorded as a
// note saying so, so the success is still recorded: one over the ledger's
// bound, or one that is not I-JSON (a lone surrogate, a number beyond a
// double), which is recorded re-encoded where that makes it I-JSON.
func recordedResult(res *mcp.CallToolResult, raw json.RawMessage) json.RawMessage {
	b, err := recordedJSON(res, raw)
	if err != nil {
		return ledgerport.ResultNote(fmt.Sprintf("The call succeeded; its result could not be encoded (%v), so it is not replayed.", err))
	}
	if ledger.CheckIJSON(b) != nil {
		clean, ok := reencoded(b)
		if !ok {
			return ledgerport.ResultNote("The call succeeded; its result is not I-JSON (RFC 7493), which the ledger records, so it is not replayed.")
		}
		b = clean
	}
	if len(b) > maxResult {
		return ledgerport.ResultNote(fmt.Sprintf(
			"The call succeeded; its result (%d bytes) is larger than the ledger records (%d bytes), so it is not replayed.", len(b), maxResult))
	}
	return b
}

// reencoded is b decoded and encoded again, which replaces lone
// surrogates with U+FFFD and keeps one of a repeated member, if that makes
// it I-JSON.
func reencoded(b []byte) (json.RawMessage, bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return nil, false
	}
	out, err := json.Marshal(v)
	if err != nil || ledger.CheckIJSON(out) != nil {
		return nil, false
	}
	return out, true
}

func recordedJSON(res *mcp.CallToolResult, raw json.RawMessage) (json.RawMessage, error) {
	var obj map[string]json.RawMessage
	if len(raw) > 0 && json.Unmarshal(raw, &obj) == nil && obj["content"] != nil {
		rec := map[string]json.RawMessage{"content": obj["content"]}
		if sc := obj["structuredContent"]; sc != nil {
			rec["structuredContent"] = sc
		}
		return json.Marshal(rec)
	}
	rec := &mcp.CallToolResult{Content: res.Content, StructuredContent: res.StructuredContent}
	if rec.Content == nil {
		rec.Content = []mcp.Content{}
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("encode result: %w", err)
	}
	return b, nil
}

// firstText is the first text content of a result, for a recorded error
// message.
func firstText(res *mcp.CallToolResult) string {
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			return t.Text
		}
	}
	return ""
}
