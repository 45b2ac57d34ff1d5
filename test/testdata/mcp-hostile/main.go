// Command mcp-hostile is an MCP server written by hand, for the tests of
// what ledger-mcp does with answers no well-behaved SDK server sends: a
// connection dropped after the tool ran, an HTTP 500, a JSON-RPC error,
// a result that is not I-JSON or that the SDK cannot decode, an answer
// over the 50 MB frame limit ("huge"), one that comes once the file
// release-<id> exists in --dir ("slow"), an answer under the wrong id
// ("wrongid", stdio), a tool name
// with "/" that claims to be read-only, a 128-byte tool name, and a
// tools/list whose nextCursor never ends (--loop-cursor); and tasks of
// MCP 2025-11-25 (tasks.go): a call of "job" with params.task answers a
// task, which completes once the file "finish-<id>" exists in --dir; with
// --revision 2026-07-28 it also answers server/discover with the tasks
// extension, and a call of "job" whose client declared the extension
// answers a task of the extension (resultType "task"; tasks/get, tasks/update,
// tasks/cancel).
// Every tool appends "tool id" to the executions file of --dir before it
// answers.
// It serves stdio, or Streamable HTTP at /mcp with --http ADDR (printing
// "listening ADDR" on stdout).
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

var (
	dir        string
	loopCursor bool
	modern     bool // --revision 2026-07-28
	mu         sync.Mutex
)

// LongTool is the name of the tool whose name is 128 bytes, MCP's longest.
var LongTool = "long_" + strings.Repeat("x", 123)

func main() {
	httpAddr := flag.String("http", "", "serve Streamable HTTP on this address instead of stdio")
	flag.StringVar(&dir, "dir", "", "directory of the executions file")
	flag.BoolVar(&loopCursor, "loop-cursor", false, "tools/list always answers the same nextCursor")
	revision := flag.String("revision", "", "2026-07-28: also serve server/discover and the tasks extension")
	flag.Parse()
	modern = *revision == "2026-07-28"
	if *httpAddr == "" {
		serveStdio()
		return
	}
	ln, err := net.Listen("tcp", *httpAddr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mcp-hostile:", err)
		os.Exit(1)
	}
	fmt.Println("listening", ln.Addr().String())
	srv := &http.Server{Handler: http.HandlerFunc(serveHTTP), ReadHeaderTimeout: 5 * time.Second}
	fmt.Fprintln(os.Stderr, srv.Serve(ln))
}

type request struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
}

// reply is what a request comes to: a raw result or error object, or one
// of the misbehaviours.
type reply struct {
	result string // raw JSON
	err    string // raw JSON error object
	drop   bool   // close the connection (stdio: exit)
	status int    // HTTP only: answer this status with a plain body
	// wrongID: answer under another id than the request's (stdio only).
	wrongID bool
}

func handle(r request) reply {
	switch r.Method {
	case "initialize":
		var p struct {
			ProtocolVersion string `json:"protocolVersion"`
		}
		_ = json.Unmarshal(r.Params, &p)
		v := "2025-06-18"
		switch p.ProtocolVersion {
		case "2025-03-26", "2025-06-18", "2025-11-25":
			v = p.ProtocolVersion
		}
		return reply{result: fmt.Sprintf(`{"protocolVersion":%q,"capabilities":{"tools":{},%s},"serverInfo":{"name":"hostile","version":"1"}}`,
			v, tasksCapability)}
	case "server/discover":
		if modern {
			return reply{result: discoverResult}
		}
	case "ping":
		return reply{result: `{}`}
	case "tools/list":
		return reply{result: toolsList()}
	case "tools/call":
		return call(r.Params)
	case "tasks/get", "tasks/result", "tasks/cancel", "tasks/update":
		return taskRequest(r.Method, r.Params)
	}
	return reply{err: fmt.Sprintf(`{"code":-32601,"message":"method not found: %s"}`, strings.ReplaceAll(r.Method, `"`, ""))}
}

func toolsList() string {
	tools := []string{
		`{"name":"charge","inputSchema":{"type":"object"}}`,
		`{"name":"drop","inputSchema":{"type":"object"}}`,
		`{"name":"http500","inputSchema":{"type":"object"}}`,
		`{"name":"rpcerror","inputSchema":{"type":"object"}}`,
		`{"name":"surrogate","inputSchema":{"type":"object"}}`,
		`{"name":"bignum","inputSchema":{"type":"object"}}`,
		`{"name":"hologram","inputSchema":{"type":"object"}}`,
		`{"name":"huge","inputSchema":{"type":"object"}}`,
		`{"name":"slow","inputSchema":{"type":"object"}}`,
		`{"name":"wrongid","inputSchema":{"type":"object"}}`,
		`{"name":"job","inputSchema":{"type":"object"},"execution":{"taskSupport":"optional"}}`,
		`{"name":"admin/delete","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}}`,
		fmt.Sprintf(`{"name":%q,"inputSchema":{"type":"object"}}`, LongTool),
	}
	cursor := ""
	if loopCursor {
		cursor = `,"nextCursor":"again"`
	}
	return `{"tools":[` + strings.Join(tools, ",") + `]` + cursor + `}`
}

func call(params json.RawMessage) reply {
	var p struct {
		Name      string `json:"name"`
		Arguments struct {
			ID string `json:"id"`
		} `json:"arguments"`
	}
	if err := json.Unmarshal(params, &p); err != nil {
		return reply{err: `{"code":-32602,"message":"bad params"}`}
	}
	record(p.Name, p.Arguments.ID)
	if rp, ok := startTask(p.Name, p.Arguments.ID, params); ok {
		return rp
	}
	switch p.Name {
	case "drop":
		return reply{drop: true}
	case "http500":
		return reply{status: http.StatusInternalServerError}
	case "rpcerror":
		return reply{err: `{"code":-32042,"message":"boom","data":{"why":"the shop said no"}}`}
	case "surrogate":
		return reply{result: `{"content":[{"type":"text","text":"done \ud800 here"}]}`}
	case "bignum":
		return reply{result: `{"content":[{"type":"text","text":"big"}],"structuredContent":{"n":1e400}}`}
	case "hologram":
		return reply{result: `{"content":[{"type":"hologram","data":"a charge of 12 EUR"}]}`}
	case "slow":
		// Answers once the file release-<id> exists in --dir.
		for {
			if _, err := os.Stat(filepath.Join(dir, "release-"+p.Arguments.ID)); err == nil {
				break
			}
			if _, err := os.Stat(dir); err != nil {
				os.Exit(0) // the test that made dir is over: no one is left to release the call
			}
			time.Sleep(10 * time.Millisecond)
		}
	case "huge":
		// Over the 50 MB frame limit of a stdio connection.
		return reply{result: `{"content":[{"type":"text","text":"` + strings.Repeat("x", 51<<20) + `"}]}`}
	case "wrongid":
		return reply{wrongID: true, result: `{"content":[{"type":"text","text":"answered under another id"}]}`}
	}
	return reply{result: fmt.Sprintf(`{"content":[{"type":"text","text":"%s %s done"}]}`, jsonText(p.Name), jsonText(p.Arguments.ID))}
}

func jsonText(s string) string {
	b, _ := json.Marshal(s)
	return string(b[1 : len(b)-1])
}

func message(id json.RawMessage, rp reply) []byte {
	if rp.err != "" {
		return []byte(fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"error":%s}`, id, rp.err))
	}
	return []byte(fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":%s}`, id, rp.result))
}

func serveStdio() {
	in := bufio.NewReader(os.Stdin)
	for {
		line, err := in.ReadBytes('\n')
		if len(line) > 0 {
			var r request
			if json.Unmarshal(line, &r) == nil && len(r.ID) > 0 && string(r.ID) != "null" {
				rp := handle(r)
				if rp.drop || rp.status != 0 {
					os.Exit(3)
				}
				id := r.ID
				if rp.wrongID {
					id = json.RawMessage(`"not-` + strings.Trim(string(r.ID), `"`) + `"`)
				}
				os.Stdout.Write(append(message(id, rp), '\n'))
			}
		}
		if err != nil {
			return
		}
	}
}

func serveHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost {
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	var r request
	if json.Unmarshal(body, &r) != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	if len(r.ID) == 0 || string(r.ID) == "null" {
		w.WriteHeader(http.StatusAccepted)
		return
	}
	rp := handle(r)
	switch {
	case rp.drop:
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
		return
	case rp.status != 0:
		// A proxy's failure, with a body that even looks like an answer.
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rp.status)
		_, _ = w.Write(message(r.ID, reply{err: `{"code":-32603,"message":"bad gateway"}`}))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if r.Method == "initialize" {
		w.Header().Set("Mcp-Session-Id", "hostile-session")
	}
	_, _ = w.Write(message(r.ID, rp))
}

// record appends "tool id" to the executions file, durably.
func record(tool, id string) {
	mu.Lock()
	defer mu.Unlock()
	f, err := os.OpenFile(filepath.Join(dir, "executions"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		panic(err)
	}
	defer func() { _ = f.Close() }()
	if _, err := f.WriteString(tool + " " + id + "\n"); err != nil {
		panic(err)
	}
	if err := f.Sync(); err != nil {
		panic(err)
	}
}
