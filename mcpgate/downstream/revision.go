package downstream

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
)

// requestVersion is the protocol revision of a downstream request: the
// one its _meta names (2026-07-28 and later), else the session's.
func requestVersion(req mcp.Request) string {
	if p := req.GetParams(); p != nil && !reflect.ValueOf(p).IsNil() {
		if v, ok := p.GetMeta()[mcp.MetaKeyProtocolVersion].(string); ok {
			return v
		}
	}
	if ss, ok := req.GetSession().(*mcp.ServerSession); ok {
		if ip := ss.InitializeParams(); ip != nil {
			return ip.ProtocolVersion
		}
	}
	return ""
}

// newerResultMembers are the members of a result that a client on a
// revision before 2026-07-28 does not know.
var newerResultMembers = []string{"resultType", "inputRequests", "requestState"}

// present adapts a result to the client's revision: a 2026-07-28 client
// gets resultType on every tools/call answer (the SDK adds it only to
// the results it makes), an older one never gets the newer members.
func present(version string, res mcp.Result) (mcp.Result, error) {
	var raw json.RawMessage
	switch r := res.(type) {
	case wire.RawResult:
		raw = r.RawJSON()
	case *mcp.CallToolResult:
		if !wire.Stateless(version) {
			return res, nil // the SDK writes no resultType it did not read
		}
		b, err := json.Marshal(r)
		if err != nil {
			return nil, fmt.Errorf("encode result: %w", err)
		}
		res, raw = wire.AsRaw(r, b), b
	default:
		return res, nil
	}
	if wire.Stateless(version) {
		if wire.HasMember(raw, "resultType") {
			return res, nil
		}
		b, ok := prepend(raw, `"resultType":"complete"`)
		if !ok {
			return res, nil
		}
		return res.(wire.RawResult).WithRaw(b), nil
	}
	set := map[string]any{}
	for _, m := range newerResultMembers {
		if wire.HasMember(raw, m) {
			set[m] = nil
		}
	}
	if len(set) == 0 {
		return res, nil
	}
	b, err := wire.WithMembers(raw, set)
	if err != nil {
		return res, nil // not an object: passed on as it came
	}
	return res.(wire.RawResult).WithRaw(b), nil
}

// prepend puts member first in the JSON object raw, leaving the rest of
// its text as it came.
func prepend(raw json.RawMessage, member string) (json.RawMessage, bool) {
	t := bytes.TrimLeft(raw, " \t\r\n")
	if len(t) == 0 || t[0] != '{' {
		return nil, false
	}
	rest := bytes.TrimLeft(t[1:], " \t\r\n")
	out := append([]byte("{"+member), ',')
	if len(rest) > 0 && rest[0] == '}' {
		out = out[:len(out)-1]
	}
	return append(out, rest...), true
}
