package tasks

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
)

// UnliftParams puts a tools/call's params.task, carried in
// _meta[MetaParamsTask], back where the upstream reads it.
func UnliftParams(params json.RawMessage) json.RawMessage {
	if !bytes.Contains(params, []byte(MetaParamsTask)) {
		return params
	}
	return wire.EditMeta(params, func(p, meta map[string]json.RawMessage) bool {
		if meta[MetaParamsTask] == nil {
			return false
		}
		p["task"] = meta[MetaParamsTask]
		delete(meta, MetaParamsTask)
		return true
	})
}

// Stash moves the capabilities.tasks of an upstream's initialize
// result to capabilities.experimental[expTasks], where the SDK keeps it.
func Stash(result json.RawMessage) json.RawMessage {
	if !bytes.Contains(result, []byte(`"tasks"`)) {
		return result
	}
	return wire.EditObject(result, func(r map[string]json.RawMessage) bool {
		moved := false
		r["capabilities"] = wire.EditObject(r["capabilities"], func(caps map[string]json.RawMessage) bool {
			if caps["tasks"] == nil {
				return false
			}
			var exp map[string]json.RawMessage
			if raw, ok := caps["experimental"]; ok && json.Unmarshal(raw, &exp) != nil {
				return false
			}
			if exp == nil {
				exp = map[string]json.RawMessage{}
			}
			exp[expTasks] = caps["tasks"]
			delete(caps, "tasks")
			var err error
			caps["experimental"], err = json.Marshal(exp)
			moved = err == nil
			return moved
		})
		return moved
	})
}

// Take removes the upstream's tasks capability from the capabilities
// the SDK decoded, and keeps it for WithCapability.
func (t *Tasks) Take(caps *mcp.ServerCapabilities) {
	t.upTasks = takeTasks(caps)
}

// takeTasks removes the upstream's tasks capability from caps, and
// returns it.
func takeTasks(caps *mcp.ServerCapabilities) any {
	t, ok := caps.Experimental[expTasks]
	if !ok {
		return nil
	}
	exp := make(map[string]any, len(caps.Experimental))
	for k, v := range caps.Experimental {
		if k != expTasks {
			exp[k] = v
		}
	}
	caps.Experimental = exp
	if len(exp) == 0 {
		caps.Experimental = nil
	}
	return t
}

// rawInit is an initialize result with members the SDK's type lacks.
type rawInit struct {
	*mcp.InitializeResult
	raw json.RawMessage
}

func (r rawInit) MarshalJSON() ([]byte, error) { return r.raw, nil }

// WithCapability gives a 2025-11-25 client the upstream's
// capabilities.tasks in the answer to initialize.
func (t *Tasks) WithCapability(res mcp.Result) mcp.Result {
	ir, ok := res.(*mcp.InitializeResult)
	if !ok || t.upTasks == nil || ir.ProtocolVersion != "2025-11-25" {
		return res
	}
	b, err := json.Marshal(ir)
	if err != nil {
		return res
	}
	var m map[string]any
	if json.Unmarshal(b, &m) != nil {
		return res
	}
	caps, _ := m["capabilities"].(map[string]any)
	if caps == nil {
		caps = map[string]any{}
	}
	caps["tasks"] = t.upTasks
	m["capabilities"] = caps
	if b, err = json.Marshal(m); err != nil {
		return res
	}
	return rawInit{ir, b}
}

// UnliftRequest applies UnliftParams to a tools/call POSTed to a
// Streamable HTTP upstream (on a copy of req), and reports whether the POST is an
// initialize request.
func UnliftRequest(req *http.Request) (out *http.Request, init bool, err error) {
	if req.Method != http.MethodPost || req.Body == nil || req.Body == http.NoBody {
		return req, false, nil
	}
	body, err := io.ReadAll(req.Body)
	_ = req.Body.Close()
	if err != nil {
		return nil, false, err
	}
	req = req.Clone(req.Context())
	body = wire.EditObject(body, func(m map[string]json.RawMessage) bool {
		var method string
		_ = json.Unmarshal(m["method"], &method)
		init = method == "initialize"
		if method != "tools/call" {
			return false
		}
		p := m["params"]
		m["params"] = UnliftParams(p)
		return !bytes.Equal(m["params"], p)
	})
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.ContentLength = int64(len(body))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return req, init, nil
}

// StashHTTP applies Stash to the answer to initialize in an
// HTTP response: one JSON-RPC message, or server-sent events.
func StashHTTP(res *http.Response) {
	if res.StatusCode != http.StatusOK || res.Body == nil {
		return
	}
	body, err := io.ReadAll(io.LimitReader(res.Body, wire.MaxBody))
	_ = res.Body.Close()
	if err == nil && bytes.Contains(body, []byte(`"tasks"`)) {
		if strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream") {
			lines := bytes.Split(body, []byte("\n"))
			for i, l := range lines {
				if d, ok := bytes.CutPrefix(l, []byte("data:")); ok {
					lines[i] = append([]byte("data: "), stashMessage(bytes.TrimSpace(d))...)
				}
			}
			body = bytes.Join(lines, []byte("\n"))
		} else {
			body = stashMessage(body)
		}
	}
	res.Body = io.NopCloser(bytes.NewReader(body))
	res.ContentLength = int64(len(body))
	res.Header.Del("Content-Length")
}

// stashMessage applies Stash to a JSON-RPC response's result.
func stashMessage(msg []byte) []byte {
	return wire.EditObject(msg, func(m map[string]json.RawMessage) bool {
		if m["result"] == nil {
			return false
		}
		m["result"] = Stash(m["result"])
		return true
	})
}
