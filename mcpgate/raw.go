package mcpgate

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The SDK decodes an upstream's answers into its own types and encodes
// them again, which drops what those types do not know (fields of newer
// protocol revisions, such as a tool's "execution") and adds empty ones.
// So that tools/list and the other forwarded answers reach the client as
// the upstream sent them, the upstream connection keeps the raw result of
// each request made with a wire.Slot in its context, and the gateway
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

// rawResult is a result that encodes as its raw text, which present
// adapts to the client's protocol revision.
type rawResult interface {
	mcp.Result
	rawJSON() json.RawMessage
	withRaw(json.RawMessage) mcp.Result
}

func (r rawTools) rawJSON() json.RawMessage     { return r.raw }
func (r rawCall) rawJSON() json.RawMessage      { return r.raw }
func (r rawPrompts) rawJSON() json.RawMessage   { return r.raw }
func (r rawPrompt) rawJSON() json.RawMessage    { return r.raw }
func (r rawResources) rawJSON() json.RawMessage { return r.raw }
func (r rawTemplates) rawJSON() json.RawMessage { return r.raw }
func (r rawRead) rawJSON() json.RawMessage      { return r.raw }
func (r rawComplete) rawJSON() json.RawMessage  { return r.raw }

func (r rawTools) withRaw(b json.RawMessage) mcp.Result     { r.raw = b; return r }
func (r rawCall) withRaw(b json.RawMessage) mcp.Result      { r.raw = b; return r }
func (r rawPrompts) withRaw(b json.RawMessage) mcp.Result   { r.raw = b; return r }
func (r rawPrompt) withRaw(b json.RawMessage) mcp.Result    { r.raw = b; return r }
func (r rawResources) withRaw(b json.RawMessage) mcp.Result { r.raw = b; return r }
func (r rawTemplates) withRaw(b json.RawMessage) mcp.Result { r.raw = b; return r }
func (r rawRead) withRaw(b json.RawMessage) mcp.Result      { r.raw = b; return r }
func (r rawComplete) withRaw(b json.RawMessage) mcp.Result  { r.raw = b; return r }

func (r rawTools) MarshalJSON() ([]byte, error)     { return r.raw, nil }
func (r rawCall) MarshalJSON() ([]byte, error)      { return r.raw, nil }
func (r rawPrompts) MarshalJSON() ([]byte, error)   { return r.raw, nil }
func (r rawPrompt) MarshalJSON() ([]byte, error)    { return r.raw, nil }
func (r rawResources) MarshalJSON() ([]byte, error) { return r.raw, nil }
func (r rawTemplates) MarshalJSON() ([]byte, error) { return r.raw, nil }
func (r rawRead) MarshalJSON() ([]byte, error)      { return r.raw, nil }
func (r rawComplete) MarshalJSON() ([]byte, error)  { return r.raw, nil }

// asRaw wraps a typed result as its raw text when the slot has one.
func asRaw(res mcp.Result, raw json.RawMessage) mcp.Result {
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

// liftReader lifts params.idempotencyKey in the newline-delimited JSON
// messages a stdio client sends.
type liftReader struct {
	src io.ReadCloser
	br  *bufio.Reader
	buf []byte
	err error
}

func newLiftReader(src io.ReadCloser) *liftReader {
	return &liftReader{src: src, br: bufio.NewReaderSize(src, 64<<10)}
}

func (r *liftReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		line, err := r.br.ReadBytes('\n')
		r.err = err
		if mayNameParamsKey(line) {
			nl := bytes.HasSuffix(line, []byte("\n"))
			line = liftBody(bytes.TrimRight(line, "\r\n"))
			if nl {
				line = append(line, '\n')
			}
		}
		r.buf = line
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

func (r *liftReader) Close() error { return r.src.Close() }
