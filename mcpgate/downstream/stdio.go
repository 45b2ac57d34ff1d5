//lint:file-ignore SA1019 roots are deprecated (SEP-2577), not gone: a client that has them is relayed them

package downstream

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/mcpgate/serverreq"
	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
)

// PeekInitialize reads the first message a stdio client sends and
// returns who the client is, and the stream to serve: that message
// again, then the rest of in. An older revision's client is its
// initialize's params; a 2026-07-28 client's request (server/discover,
// say) gives its protocol version and capabilities (_meta); anything
// else gives nil. With them as UpstreamOptions.Client the upstream is
// started once for the client.
func PeekInitialize(in io.ReadCloser) (*mcp.InitializeParams, io.ReadCloser) {
	br := bufio.NewReaderSize(in, 64<<10)
	line, _ := br.ReadBytes('\n') // an error comes again from br
	rest := struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(line), br), in}
	var msg struct {
		Method string          `json:"method"`
		Params json.RawMessage `json:"params"`
	}
	if json.Unmarshal(line, &msg) != nil {
		return nil, rest
	}
	if msg.Method != "initialize" {
		var stateless struct {
			Meta map[string]any `json:"_meta"`
		}
		_ = json.Unmarshal(msg.Params, &stateless)
		v, _ := stateless.Meta[mcp.MetaKeyProtocolVersion].(string)
		caps, ok := wire.AsMap(stateless.Meta[mcp.MetaKeyClientCapabilities])
		if !wire.Stateless(v) || !ok {
			return nil, rest
		}
		return &mcp.InitializeParams{ProtocolVersion: v, Capabilities: serverreq.WireClientCapabilities(caps)}, rest
	}
	var p mcp.InitializeParams
	var roots struct { // which the SDK's type cannot tell absent (as its server reads it)
		Capabilities struct {
			Roots *mcp.RootCapabilities `json:"roots"`
		} `json:"capabilities"`
	}
	if json.Unmarshal(msg.Params, &p) != nil || json.Unmarshal(msg.Params, &roots) != nil {
		return nil, rest
	}
	if p.Capabilities != nil {
		p.Capabilities.RootsV2 = roots.Capabilities.Roots
	}
	return &p, rest
}
