package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The payment tools of reconciliation (SPEC §15): pay stores the
// idempotency key ledger-mcp sends in _meta with each payment, as a
// payment provider stores the key its client passes, and find_payment
// (read-only) looks a payment up by that key or by order. Files of --dir
// steer them: crash-before-ORDER and crash-after-ORDER make the next pay
// of ORDER die before or after it stores the payment (each once);
// lookup-answer holds a structuredContent find_payment answers instead
// of looking; while lookup-hold exists, find_payment waits.

// metaKey is where ledger-mcp puts a call's idempotency key.
const metaKey = "io.effect-ledger/key"

type payArgs struct {
	Order  string  `json:"order"`
	Amount float64 `json:"amount,omitempty"`
}

type findArgs struct {
	Key   string `json:"key,omitempty"`
	Order string `json:"order,omitempty"`
}

func addPaymentTools(s *mcp.Server) {
	mcp.AddTool(s, &mcp.Tool{Name: "pay", Description: "pay an order; the payment keeps the caller's idempotency key"},
		func(_ context.Context, r *mcp.CallToolRequest, a payArgs) (*mcp.CallToolResult, any, error) {
			key, _ := r.Params.Meta[metaKey].(string)
			n := record("pay", a.Order)
			crashIf("crash-before-" + a.Order)
			id := fmt.Sprintf("pay_%s_%d", a.Order, n)
			appendLine("payments", fmt.Sprintf("%s %s %s", key, a.Order, id))
			crashIf("crash-after-" + a.Order)
			return nil, map[string]any{"payment_id": id, "key": key}, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "find_payment", Description: "look a payment up by idempotency key or order",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(_ context.Context, _ *mcp.CallToolRequest, a findArgs) (*mcp.CallToolResult, any, error) {
			record("find_payment", a.Key+a.Order)
			for exists("lookup-hold") {
				time.Sleep(5 * time.Millisecond)
			}
			if b, err := os.ReadFile(filepath.Join(dir, "lookup-answer")); err == nil {
				return nil, json.RawMessage(b), nil
			}
			b, _ := os.ReadFile(filepath.Join(dir, "payments"))
			for l := range strings.Lines(string(b)) {
				f := strings.Fields(l)
				if len(f) == 3 && (a.Key != "" && f[0] == a.Key || a.Key == "" && f[1] == a.Order) {
					return nil, map[string]any{"applied": true, "external_ref": f[2]}, nil
				}
			}
			return nil, map[string]any{"applied": false}, nil
		})
}

// crashIf ends the server when the file name exists in --dir, once.
func crashIf(name string) {
	if exists(name) {
		_ = os.Remove(filepath.Join(dir, name))
		os.Exit(3)
	}
}

// appendLine appends line to the file name of --dir, synced.
func appendLine(name, line string) {
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		panic(err)
	}
	if _, err := f.WriteString(line + "\n"); err != nil {
		panic(err)
	}
	if err := f.Sync(); err != nil {
		panic(err)
	}
	_ = f.Close()
}
