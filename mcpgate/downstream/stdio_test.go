package downstream

import (
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/mcpgate/serverreq"
	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
)

// TestPeekInitialize: the first message tells who the one stdio client
// is, and is served again as it came.
func TestPeekInitialize(t *testing.T) {
	for name, tc := range map[string]struct {
		line    string
		version string
		roots   bool
		elicit  bool
	}{
		"initialize": {`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25",` +
			`"capabilities":{"roots":{},"elicitation":{}},"clientInfo":{"name":"agent","version":"1"}}}`, "2025-11-25", true, true},
		"no roots": {`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",` +
			`"capabilities":{},"clientInfo":{"name":"agent","version":"1"}}}`, "2025-06-18", false, false},
		"stateless": {`{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{"_meta":{` +
			`"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"roots":{"listChanged":true}}}}}`,
			wire.Version20260728, true, false},
		"other":    {`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}`, "", false, false},
		"not json": {`hello`, "", false, false},
		"nothing":  {``, "", false, false},
	} {
		t.Run(name, func(t *testing.T) {
			in := tc.line + "\n" + `{"jsonrpc":"2.0","method":"notifications/initialized"}` + "\n"
			p, rest := PeekInitialize(io.NopCloser(strings.NewReader(in)))
			b, err := io.ReadAll(rest)
			require.NoError(t, err)
			assert.Equal(t, in, string(b), "served as it came")
			if tc.version == "" {
				assert.Nil(t, p)
				return
			}
			require.NotNil(t, p)
			assert.Equal(t, tc.version, p.ProtocolVersion)
			assert.Equal(t, tc.roots, serverreq.HasRoots(p.Capabilities))
			assert.Equal(t, tc.elicit, p.Capabilities.Elicitation != nil)
		})
	}
}
