package api

import (
	"bytes"
	"encoding/json"
	"net"
	"strconv"
	"strings"
)

// WrapListener returns a listener whose connections answer in the
// contract's JSON error shape even when net/http refuses a request before
// any handler runs: a malformed request line or path (bad percent-encoding:
// 400 invalid_request), headers over the server's MaxHeaderBytes (431
// headers_too_large), or an unsupported transfer encoding (501). net/http
// writes those as plain text straight to the connection; the wrapper
// recognises exactly that form and rewrites it. Responses written by
// handlers are never touched. Wrap the listener that Serve reads from (for
// TLS, the TLS listener).
func WrapListener(ln net.Listener) net.Listener { return &errorListener{Listener: ln} }

type errorListener struct{ net.Listener }

func (l *errorListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &errorConn{Conn: c}, nil
}

// errorConn rewrites net/http's plain-text early error responses.
type errorConn struct{ net.Conn }

// plainErrorHeaders is what net/http puts between the status line and the
// body of the responses it writes itself before a handler runs.
const plainErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

func (c *errorConn) Write(b []byte) (int, error) {
	if !bytes.HasPrefix(b, []byte("HTTP/1.1 ")) || !bytes.Contains(b, []byte(plainErrorHeaders)) {
		return c.Conn.Write(b)
	}
	head, text, _ := strings.Cut(string(b), plainErrorHeaders)
	statusLine, _, _ := strings.Cut(head, "\r\n")
	code3, _, _ := strings.Cut(strings.TrimPrefix(statusLine, "HTTP/1.1 "), " ")
	status, _ := strconv.Atoi(code3)
	code, msg := "invalid_request", "the request is malformed"
	switch status {
	case 431:
		code, msg = "headers_too_large", "the request headers are too large"
	case 501:
		code, msg = "not_implemented", "the request uses a transfer encoding this server does not support"
	case 400:
		// net/http's reason, e.g. "400 Bad Request: malformed Host header".
		if _, why, ok := strings.Cut(text, ": "); ok && why != "" {
			msg = "the request is malformed: " + why
		}
	default:
		return c.Conn.Write(b)
	}
	body, _ := json.Marshal(map[string]any{"error": map[string]any{"code": code, "message": msg, "details": map[string]any{}}})
	body = append(body, '\n')
	out := statusLine + "\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) +
		"\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n" + string(body)
	if _, err := c.Conn.Write([]byte(out)); err != nil {
		return 0, err
	}
	httpErrors.WithLabelValues(code).Inc()
	return len(b), nil
}
