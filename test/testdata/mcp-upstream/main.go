//lint:file-ignore SA1019 its tools ask their client with sampling, roots and logging of the revisions before 2026-07-28

// Command mcp-upstream is the MCP server the ledger-mcp tests put behind
// the gateway. Every tool appends a line to the executions file of
// --dir before it acts, so a test counts how often a call really ran,
// across restarts of this server. It serves stdio, or Streamable HTTP at
// /mcp with --http ADDR (printing "listening ADDR" on stdout).
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

var (
	dir      string
	revision string
	payments bool
)

func main() {
	httpAddr := flag.String("http", "", "serve Streamable HTTP on this address instead of stdio")
	flag.StringVar(&dir, "dir", "", "directory of the executions file and release files")
	flag.StringVar(&revision, "revision", "", "negotiate only this protocol revision (default: the SDK's)")
	flag.BoolVar(&payments, "payments", false, "also serve the payment tools of reconciliation (payments.go)")
	flag.Parse()
	s := newServer()
	if *httpAddr == "" {
		if err := s.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
			fmt.Fprintln(os.Stderr, "mcp-upstream:", err)
		}
		return
	}
	ln, err := net.Listen("tcp", *httpAddr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mcp-upstream:", err)
		os.Exit(1)
	}
	fmt.Println("listening", ln.Addr().String())
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	fmt.Fprintln(os.Stderr, srv.Serve(ln))
}

type orderArgs struct {
	Order  string  `json:"order"`
	Amount float64 `json:"amount,omitempty"`
}

type idArgs struct {
	ID string `json:"id"`
}

type chargeOut struct {
	ChargeID string `json:"charge_id"`
	Run      int    `json:"run"`
}

func ptr(b bool) *bool { return &b }

func newServer() *mcp.Server {
	var opts *mcp.ServerOptions
	if revision != "" {
		opts = &mcp.ServerOptions{SupportedProtocolVersions: []string{revision}}
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "test-shop", Version: "1.0.0"}, opts)
	// No annotations: a non-idempotent destructive effect.
	mcp.AddTool(s, &mcp.Tool{Name: "charge", Description: "charge an order"},
		func(_ context.Context, _ *mcp.CallToolRequest, a orderArgs) (*mcp.CallToolResult, chargeOut, error) {
			n := record("charge", a.Order)
			return nil, chargeOut{ChargeID: fmt.Sprintf("ch_%s_%d", a.Order, n), Run: n}, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "lookup", Description: "look an order up", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(_ context.Context, _ *mcp.CallToolRequest, a orderArgs) (*mcp.CallToolResult, any, error) {
			n := record("lookup", a.Order)
			return text(fmt.Sprintf("order %s, lookup %d", a.Order, n)), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "refund", Description: "refund an order (always declined)",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(false)}},
		func(_ context.Context, _ *mcp.CallToolRequest, a orderArgs) (*mcp.CallToolResult, any, error) {
			n := record("refund", a.Order)
			return errorText(fmt.Sprintf("card declined for %s (run %d)", a.Order, n)), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "slow", Description: "finishes once the file release-ID exists in --dir",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(false), OpenWorldHint: ptr(false)}},
		func(ctx context.Context, _ *mcp.CallToolRequest, a idArgs) (*mcp.CallToolResult, any, error) {
			n := record("slow", a.ID)
			for !exists("release-" + a.ID) {
				select {
				case <-ctx.Done():
					return nil, nil, ctx.Err()
				case <-time.After(5 * time.Millisecond):
				}
			}
			return text(fmt.Sprintf("slow %s done, run %d", a.ID, n)), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "crash", Description: "the server dies during the call"},
		func(context.Context, *mcp.CallToolRequest, idArgs) (*mcp.CallToolResult, any, error) {
			record("crash", "")
			os.Exit(3)
			return nil, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "crash_idem", Description: "idempotent; the server dies during the first call of an id",
		Annotations: &mcp.ToolAnnotations{IdempotentHint: true, DestructiveHint: ptr(false)}},
		func(_ context.Context, _ *mcp.CallToolRequest, a idArgs) (*mcp.CallToolResult, any, error) {
			if n := record("crash_idem", a.ID); n == 1 {
				os.Exit(3)
			}
			return text("set " + a.ID), nil, nil
		})
	// A failure that applied nothing: observe fails until the entity
	// exists (the MCP memory server's add_observations), create_entity
	// fixes the cause.
	mcp.AddTool(s, &mcp.Tool{Name: "observe", Description: "add an observation to an entity (fails if it does not exist)",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(false), OpenWorldHint: ptr(false)}},
		func(_ context.Context, _ *mcp.CallToolRequest, a idArgs) (*mcp.CallToolResult, any, error) {
			n := record("observe", a.ID)
			if !exists("entity-" + a.ID) {
				return errorText(fmt.Sprintf("Entity with name %s not found (run %d)", a.ID, n)), nil, nil
			}
			return text(fmt.Sprintf("observation added to %s (run %d)", a.ID, n)), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "create_entity", Description: "create an entity",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(false), OpenWorldHint: ptr(false), IdempotentHint: true}},
		func(_ context.Context, _ *mcp.CallToolRequest, a idArgs) (*mcp.CallToolResult, any, error) {
			record("create_entity", a.ID)
			if err := os.WriteFile(filepath.Join(dir, "entity-"+a.ID), nil, 0o600); err != nil {
				return nil, nil, err
			}
			return text("created " + a.ID), nil, nil
		})
	// A call that asks the user first (MRTR, SPEC §11.1): it answers
	// input_required with an elicitation until the round's inputResponses
	// carry the answer, and acts only on accept.
	mcp.AddTool(s, &mcp.Tool{Name: "confirm", Description: "asks the user to confirm, then acts"},
		func(_ context.Context, r *mcp.CallToolRequest, a idArgs) (*mcp.CallToolResult, any, error) {
			return confirm(r, a.ID), nil, nil
		})
	// whoami says who the server was told the client is (SEP-2575's
	// per-request _meta, else the session's initialize).
	mcp.AddTool(s, &mcp.Tool{Name: "whoami", Description: "the client as this server sees it",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(_ context.Context, r *mcp.CallToolRequest, _ any) (*mcp.CallToolResult, any, error) {
			name, caps := "", r.ClientCapabilities()
			if ci := r.ClientInfo(); ci != nil {
				name = ci.Name
			}
			return text(fmt.Sprintf("client=%s version=%s elicitation=%t", name, r.ProtocolVersion(),
				caps != nil && caps.Elicitation != nil)), nil, nil
		})
	addAskingTools(s)
	if payments {
		addPaymentTools(s)
	}
	addLaterTools(s)
	s.AddPrompt(&mcp.Prompt{Name: "greet", Description: "a greeting"},
		func(_ context.Context, r *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			return &mcp.GetPromptResult{Messages: []*mcp.PromptMessage{{Role: "user",
				Content: &mcp.TextContent{Text: "hello " + r.Params.Arguments["name"]}}}}, nil
		})
	s.AddResource(&mcp.Resource{Name: "terms", URI: "shop://terms", MIMEType: "text/plain"},
		func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: "shop://terms", Text: "no refunds"}}}, nil
		})
	return s
}

// confirm is the confirm tool: "confirm-ask ID" is recorded for each
// round that asks, "confirm ID" when it acts.
func confirm(r *mcp.CallToolRequest, id string) *mcp.CallToolResult {
	answer, ok := r.Params.InputResponses["ok"].(*mcp.ElicitResult)
	if !ok {
		record("confirm-ask", id)
		return &mcp.CallToolResult{RequestState: "state-" + id, InputRequests: mcp.InputRequestMap{"ok": &mcp.ElicitParams{
			Message:         "Really do " + id + "?",
			RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{}},
		}}}
	}
	if r.Params.RequestState != "state-"+id {
		return errorText(fmt.Sprintf("lost requestState: %q", r.Params.RequestState))
	}
	if answer.Action != "accept" {
		return errorText(fmt.Sprintf("the user answered %s: nothing done", answer.Action))
	}
	for exists("hold-" + id) { // a test holds the acting round (a gateway killed meanwhile)
		time.Sleep(5 * time.Millisecond)
	}
	n := record("confirm", id)
	return text(fmt.Sprintf("confirmed %s, run %d", id, n))
}

func text(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}

// errorText is a tool's error answer with the text s.
func errorText(s string) *mcp.CallToolResult {
	res := text(s)
	res.IsError = true
	return res
}

func exists(name string) bool {
	_, err := os.Stat(filepath.Join(dir, name))
	return err == nil
}

// record appends "tool id" to the executions file and returns how many
// executions of that tool and id it holds now.
func record(tool, id string) int {
	path := filepath.Join(dir, "executions")
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		panic(err)
	}
	line := tool + " " + id + "\n"
	if _, err := f.WriteString(line); err != nil {
		panic(err)
	}
	if err := f.Sync(); err != nil {
		panic(err)
	}
	_ = f.Close()
	b, err := os.ReadFile(path)
	if err != nil {
		panic(err)
	}
	return countLines(string(b), line)
}

// countLines counts the lines of s equal to line (which ends in "\n").
func countLines(s, line string) int {
	n := 0
	for l := range strings.Lines(s) {
		if l == line {
			n++
		}
	}
	return n
}

// addAskingTools adds the tools that ask their client during the call
// with server→client requests (revisions before 2026-07-28): each
// records "TOOL ID" only when it acts.
func addAskingTools(s *mcp.Server) {
	mcp.AddTool(s, &mcp.Tool{Name: "ask_elicit", Description: "asks the user (elicitation/create), acts on accept"},
		func(ctx context.Context, r *mcp.CallToolRequest, a idArgs) (*mcp.CallToolResult, any, error) {
			res, err := r.Session.Elicit(ctx, &mcp.ElicitParams{Message: "Really do " + a.ID + "?",
				RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{}}})
			if err != nil {
				return nil, nil, fmt.Errorf("elicit: %w", err)
			}
			if res.Action != "accept" {
				return errorText(fmt.Sprintf("the user answered %s: nothing done", res.Action)), nil, nil
			}
			n := record("ask_elicit", a.ID)
			return text(fmt.Sprintf("elicited %s, run %d", a.ID, n)), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "ask_sample", Description: "asks the client's model (sampling/createMessage), then acts"},
		func(ctx context.Context, r *mcp.CallToolRequest, a idArgs) (*mcp.CallToolResult, any, error) {
			res, err := r.Session.CreateMessage(ctx, &mcp.CreateMessageParams{MaxTokens: 10,
				Messages: []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: "name " + a.ID}}}})
			if err != nil {
				return nil, nil, fmt.Errorf("sample: %w", err)
			}
			reply := ""
			if t, ok := res.Content.(*mcp.TextContent); ok {
				reply = t.Text
			}
			n := record("ask_sample", a.ID)
			return text(fmt.Sprintf("sampled %s: %s, run %d", a.ID, reply, n)), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "ask_roots", Description: "lists the client's roots (roots/list), then acts"},
		func(ctx context.Context, r *mcp.CallToolRequest, a idArgs) (*mcp.CallToolResult, any, error) {
			res, err := r.Session.ListRoots(ctx, nil)
			if err != nil {
				return nil, nil, fmt.Errorf("roots: %w", err)
			}
			var uris []string
			for _, root := range res.Roots {
				uris = append(uris, root.URI)
			}
			n := record("ask_roots", a.ID)
			return text(fmt.Sprintf("roots of %s: [%s], run %d", a.ID, strings.Join(uris, " "), n)), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "log_then_charge", Description: "logs a message (notifications/message), then acts"},
		func(ctx context.Context, r *mcp.CallToolRequest, a idArgs) (*mcp.CallToolResult, any, error) {
			_ = r.Session.Log(ctx, &mcp.LoggingMessageParams{Level: "info", Logger: "shop", Data: "charging " + a.ID})
			n := record("log_then_charge", a.ID)
			return text(fmt.Sprintf("charged %s, run %d", a.ID, n)), nil, nil
		})
}
