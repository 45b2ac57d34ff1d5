package downstream

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"

	"github.com/effect-ledger/effect-ledger/mcpgate/tasks"
	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
)

// MetaParamsKey carries a call's params.idempotencyKey from the transport
// to the decision: the SDK's typed params have no such field, so the
// transport moves it into _meta under this name before decoding.
const MetaParamsKey = "io.effect-ledger/params.idempotencyKey"

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

// liftParamsKey moves params.idempotencyKey of a tools/call into _meta
// under MetaParamsKey, and params.task under tasks.MetaParamsTask, where the
// typed request keeps them. Anything it cannot parse is returned
// unchanged, for the SDK to answer.
func liftParamsKey(params json.RawMessage) json.RawMessage {
	if !mayNameParamsKey(params) {
		return params
	}
	return wire.EditMeta(params, func(p, meta map[string]json.RawMessage) bool {
		key, hasKey := p["idempotencyKey"]
		task, hasTask := p["task"]
		if hasKey {
			delete(p, "idempotencyKey")
			meta[MetaParamsKey] = key
		}
		if hasTask {
			delete(p, "task")
			meta[tasks.MetaParamsTask] = task
		}
		return hasKey || hasTask
	})
}

// liftMessage applies liftParamsKey to one JSON-RPC message's text.
func liftMessage(raw json.RawMessage) json.RawMessage {
	return wire.EditObject(raw, func(m map[string]json.RawMessage) bool {
		var method string
		if m["params"] == nil || json.Unmarshal(m["method"], &method) != nil || method != "tools/call" {
			return false
		}
		m["params"] = liftParamsKey(m["params"])
		return true
	})
}

// liftHTTP lifts params.idempotencyKey in the JSON-RPC bodies POSTed to a
// Streamable HTTP endpoint (one message, or a batch).
func liftHTTP(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Body == nil {
			next.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, wire.MaxBody))
		if err != nil {
			http.Error(w, "request body too large or unreadable", http.StatusRequestEntityTooLarge)
			return
		}
		if mayNameParamsKey(body) {
			body = liftBody(body)
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		next.ServeHTTP(w, r)
	})
}

// mayNameParamsKey reports whether a message's text may hold a member
// named idempotencyKey or task: it does, or it has an escape sequence
// that might spell it ("idempotency\u004bey"). Only such messages are
// parsed.
func mayNameParamsKey(b []byte) bool {
	return bytes.Contains(b, []byte(`"idempotencyKey"`)) || bytes.Contains(b, []byte(`"task"`)) || bytes.Contains(b, []byte(`\u`))
}

func liftBody(body []byte) []byte {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 || trimmed[0] != '[' {
		return liftMessage(body)
	}
	var batch []json.RawMessage
	if json.Unmarshal(trimmed, &batch) != nil {
		return body
	}
	for i := range batch {
		batch[i] = liftMessage(batch[i])
	}
	out, err := json.Marshal(batch)
	if err != nil {
		return body
	}
	return out
}
