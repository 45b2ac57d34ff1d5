package wire

import (
	"encoding/json"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The SDK decodes an upstream's answers into its own types and encodes
// them again, which drops what those types do not know (fields of newer
// protocol revisions, such as a tool's "execution") and adds empty ones.
// So that tools/list and the other forwarded answers reach the client as
// the upstream sent them, the upstream connection keeps the raw result of
// each request made with a Slot in its context, and the gateway
// answers with that text (package upstream keeps them).

// Results that encode as the raw text they came from. Each embeds the
// SDK's type, so it is an mcp.Result, and overrides its encoding.
type (
	rawTools struct {
		*mcp.ListToolsResult
		raw json.RawMessage
	}
	rawCall struct {
		*mcp.CallToolResult
		raw json.RawMessage
	}
	rawPrompts struct {
		*mcp.ListPromptsResult
		raw json.RawMessage
	}
	rawPrompt struct {
		*mcp.GetPromptResult
		raw json.RawMessage
	}
	rawResources struct {
		*mcp.ListResourcesResult
		raw json.RawMessage
	}
	rawTemplates struct {
		*mcp.ListResourceTemplatesResult
		raw json.RawMessage
	}
	rawRead struct {
		*mcp.ReadResourceResult
		raw json.RawMessage
	}
	rawComplete struct {
		*mcp.CompleteResult
		raw json.RawMessage
	}
)

// RawResult is a result that encodes as its raw text: RawJSON is that
// text, WithRaw the same result with other text (the answer adapted to
// the client's protocol revision, a member set).
type RawResult interface {
	mcp.Result
	RawJSON() json.RawMessage
	WithRaw(json.RawMessage) mcp.Result
}

func (r rawTools) RawJSON() json.RawMessage     { return r.raw }
func (r rawCall) RawJSON() json.RawMessage      { return r.raw }
func (r rawPrompts) RawJSON() json.RawMessage   { return r.raw }
func (r rawPrompt) RawJSON() json.RawMessage    { return r.raw }
func (r rawResources) RawJSON() json.RawMessage { return r.raw }
func (r rawTemplates) RawJSON() json.RawMessage { return r.raw }
func (r rawRead) RawJSON() json.RawMessage      { return r.raw }
func (r rawComplete) RawJSON() json.RawMessage  { return r.raw }

func (r rawTools) WithRaw(b json.RawMessage) mcp.Result     { r.raw = b; return r }
func (r rawCall) WithRaw(b json.RawMessage) mcp.Result      { r.raw = b; return r }
func (r rawPrompts) WithRaw(b json.RawMessage) mcp.Result   { r.raw = b; return r }
func (r rawPrompt) WithRaw(b json.RawMessage) mcp.Result    { r.raw = b; return r }
func (r rawResources) WithRaw(b json.RawMessage) mcp.Result { r.raw = b; return r }
func (r rawTemplates) WithRaw(b json.RawMessage) mcp.Result { r.raw = b; return r }
func (r rawRead) WithRaw(b json.RawMessage) mcp.Result      { r.raw = b; return r }
func (r rawComplete) WithRaw(b json.RawMessage) mcp.Result  { r.raw = b; return r }

func (r rawTools) MarshalJSON() ([]byte, error)     { return r.raw, nil }
func (r rawCall) MarshalJSON() ([]byte, error)      { return r.raw, nil }
func (r rawPrompts) MarshalJSON() ([]byte, error)   { return r.raw, nil }
func (r rawPrompt) MarshalJSON() ([]byte, error)    { return r.raw, nil }
func (r rawResources) MarshalJSON() ([]byte, error) { return r.raw, nil }
func (r rawTemplates) MarshalJSON() ([]byte, error) { return r.raw, nil }
func (r rawRead) MarshalJSON() ([]byte, error)      { return r.raw, nil }
func (r rawComplete) MarshalJSON() ([]byte, error)  { return r.raw, nil }

// AsRaw wraps a typed result as its raw text raw (a Slot's), when there
// is one.
func AsRaw(res mcp.Result, raw json.RawMessage) mcp.Result {
	if len(raw) == 0 || res == nil {
		return res
	}
	switch r := res.(type) {
	case *mcp.ListToolsResult:
		return rawTools{r, raw}
	case *mcp.CallToolResult:
		return rawCall{r, raw}
	case *mcp.ListPromptsResult:
		return rawPrompts{r, raw}
	case *mcp.GetPromptResult:
		return rawPrompt{r, raw}
	case *mcp.ListResourcesResult:
		return rawResources{r, raw}
	case *mcp.ListResourceTemplatesResult:
		return rawTemplates{r, raw}
	case *mcp.ReadResourceResult:
		return rawRead{r, raw}
	case *mcp.CompleteResult:
		return rawComplete{r, raw}
	}
	return res
}

// RawCall is a tools/call result that encodes as raw, whatever raw is.
func RawCall(res *mcp.CallToolResult, raw json.RawMessage) RawResult { return rawCall{res, raw} }
