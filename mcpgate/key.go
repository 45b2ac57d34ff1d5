package mcpgate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/mcpgate/tasks"
	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
)

// Keys of _meta the gateway reads and writes (SPEC §11).
const (
	MetaIdempotencyKey = "io.effect-ledger/idempotency-key"
	MetaStatus         = "io.effect-ledger/status"
	MetaKey            = "io.effect-ledger/key"
	MetaReplayed       = "io.effect-ledger/replayed"
	MetaReceipt        = "io.effect-ledger/receipt"
)

// metaParamsKey carries a call's params.idempotencyKey from the transport
// to the decision: the SDK's typed params have no such field, so the
// transport moves it into _meta under this name before decoding.
const metaParamsKey = "io.effect-ledger/params.idempotencyKey"

// callKey returns the idempotency key of a tools/call (SPEC §11), in this
// order: _meta["io.effect-ledger/idempotency-key"], params.idempotencyKey,
// else the clients' derived key over the ledger's tool name and
// {"arguments": <arguments>, "scope": <scope>}.
func callKey(meta mcp.Meta, ledgerTool string, args json.RawMessage, scope string) (string, error) {
	for _, name := range []string{MetaIdempotencyKey, metaParamsKey} {
		v, ok := meta[name]
		if !ok || v == nil {
			continue
		}
		s, ok := v.(string)
		if !ok {
			return "", fmt.Errorf("the idempotency key must be a string, not %T", v)
		}
		// The ledger replaces a key too short to dedupe with a generated
		// one, so every identical call would run: an explicit key must be
		// one the ledger keeps (SPEC §1), or the call is refused.
		if len(s) < ledger.MinKeyLen {
			return "", fmt.Errorf("the idempotency key %q is shorter than %d bytes, so it could not deduplicate "+
				"(leave it out and the gateway derives one from the call)", s, ledger.MinKeyLen)
		}
		if err := ledger.ValidateKey(s); err != nil {
			return "", fmt.Errorf("the idempotency key must be %d–%d bytes of visible ASCII (0x21–0x7E)", ledger.MinKeyLen, ledger.MaxKeyLen)
		}
		if strings.HasPrefix(s, ledger.GeneratedKeyPrefix) {
			return "", fmt.Errorf("the idempotency key may not start with %q, which the ledger keeps for keys it generates", ledger.GeneratedKeyPrefix)
		}
		return s, nil
	}
	return DeriveKey(ledgerTool, args, scope)
}

// DeriveKey is the key of a call that names none: the clients' derived
// key (client.DeriveKey: "dk_" + hex SHA-256(tool ‖ 0x00 ‖ JCS(input)))
// over the ledger's tool name and {"arguments": args, "scope": scope}, so
// the same call with the same arguments in the same scope is the same
// effect across retries and restarts.
func DeriveKey(ledgerTool string, args json.RawMessage, scope string) (string, error) {
	return client.DeriveKey(ledgerTool, map[string]any{"arguments": args, "scope": scope})
}

// forwardMeta is the _meta a forwarded call carries upstream: the
// client's own, without what only the gateway reads.
func forwardMeta(meta mcp.Meta) mcp.Meta {
	if len(meta) == 0 {
		return nil
	}
	out := mcp.Meta{}
	for k, v := range meta {
		if k != MetaIdempotencyKey && k != metaParamsKey {
			out[k] = v
		}
	}
	return out
}

// liftParamsKey moves params.idempotencyKey of a tools/call into _meta
// under metaParamsKey, and params.task under tasks.MetaParamsTask, where the
// typed request keeps them. Anything it cannot parse is returned
// unchanged, for the SDK to answer.
func liftParamsKey(params json.RawMessage) json.RawMessage {
	if !mayNameParamsKey(params) {
		return params
	}
	var p map[string]json.RawMessage
	if json.Unmarshal(params, &p) != nil {
		return params
	}
	key, hasKey := p["idempotencyKey"]
	task, hasTask := p["task"]
	if !hasKey && !hasTask {
		return params
	}
	meta := map[string]json.RawMessage{}
	if raw, ok := p["_meta"]; ok && json.Unmarshal(raw, &meta) != nil {
		return params
	}
	if hasKey {
		delete(p, "idempotencyKey")
		meta[metaParamsKey] = key
	}
	if hasTask {
		delete(p, "task")
		meta[tasks.MetaParamsTask] = task
	}
	b, err := json.Marshal(meta)
	if err != nil {
		return params
	}
	p["_meta"] = b
	out, err := json.Marshal(p)
	if err != nil {
		return params
	}
	return out
}

// liftMessage applies liftParamsKey to one JSON-RPC message's text.
func liftMessage(raw json.RawMessage) json.RawMessage {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil || m["params"] == nil {
		return raw
	}
	var method string
	if json.Unmarshal(m["method"], &method) != nil || method != "tools/call" {
		return raw
	}
	m["params"] = liftParamsKey(m["params"])
	out, err := json.Marshal(m)
	if err != nil {
		return raw
	}
	return out
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
