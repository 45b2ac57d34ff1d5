package upstream

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/effect-ledger/effect-ledger/mcpgate/tasks"
	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
)

// rawRoundTripper keeps raw results for a Streamable HTTP upstream. The
// SDK's own connection type must stay unwrapped there, so the raw answer
// is read off the HTTP response of the POST that carried the request:
// its context holds a wire.Slot, and its body is one JSON-RPC message or
// a stream of server-sent events ending with the answer.
type rawRoundTripper struct{ next http.RoundTripper }

func (t rawRoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	req, init, err := tasks.UnliftRequest(req)
	if err != nil {
		return nil, err
	}
	slot, ok := wire.SlotOf(req.Context())
	if ok && req.Method == http.MethodPost {
		slot.MarkWritten() // it may reach the server from here on
	}
	res, err := t.next.RoundTrip(req)
	if init && err == nil {
		tasks.StashHTTP(res)
	}
	if err != nil || !ok || req.Method != http.MethodPost || res.Body == nil {
		return res, err
	}
	// A 5xx is the transport's or a proxy's failure, not the server's
	// answer, even when its body looks like one.
	if res.StatusCode >= http.StatusInternalServerError {
		return res, err
	}
	sse := strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream")
	res.Body = &rawBody{ReadCloser: res.Body, slot: slot, sse: sse}
	return res, nil
}

// rawBody watches a response body as the SDK reads it, and puts the
// result of the first JSON-RPC response in it into the slot before the SDK
// sees that response.
type rawBody struct {
	io.ReadCloser
	slot *wire.Slot
	sse  bool
	buf  []byte
	done bool
}

func (b *rawBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if b.done {
		return n, err
	}
	b.buf = append(b.buf, p[:n]...)
	switch {
	case len(b.buf) > wire.MaxBody:
		b.done, b.buf = true, nil
	case b.sse:
		b.scanEvents()
	case err != nil:
		b.take(b.buf)
		b.done, b.buf = true, nil
	}
	return n, err
}

// scanEvents takes the data of each complete event in the buffer.
func (b *rawBody) scanEvents() {
	for !b.done {
		text := bytes.ReplaceAll(b.buf, []byte("\r\n"), []byte("\n"))
		end := bytes.Index(text, []byte("\n\n"))
		if end < 0 {
			return
		}
		var data [][]byte
		for line := range bytes.SplitSeq(text[:end], []byte("\n")) {
			if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
				data = append(data, bytes.TrimPrefix(d, []byte(" ")))
			}
		}
		b.buf = text[end+2:]
		b.take(bytes.Join(data, []byte("\n")))
	}
}

// take keeps msg's result or error if msg is a JSON-RPC response.
func (b *rawBody) take(msg []byte) {
	var m struct {
		Method string          `json:"method"`
		Result json.RawMessage `json:"result"`
		Error  *jsonrpc.Error  `json:"error"`
	}
	if json.Unmarshal(msg, &m) != nil || m.Method != "" || (m.Result == nil && m.Error == nil) {
		return
	}
	b.slot.Put(m.Result, m.Error)
	b.done, b.buf = true, nil
}
