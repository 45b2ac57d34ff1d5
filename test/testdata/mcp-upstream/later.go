package main

import (
	"context"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// addLaterTools adds ask_sample_later, which asks its client's model
// only once the file release-ID exists in --dir (for the test of two
// calls at once, whose requests must each reach their own call), and
// ask_twice, which acts between two questions to its user.
func addLaterTools(s *mcp.Server) {
	mcp.AddTool(s, &mcp.Tool{Name: "ask_twice", Description: "asks, saves a draft, asks again, then sends it"},
		func(ctx context.Context, r *mcp.CallToolRequest, a idArgs) (*mcp.CallToolResult, any, error) {
			ask := func(q string) (bool, error) {
				res, err := r.Session.Elicit(ctx, &mcp.ElicitParams{Message: q + " " + a.ID + "?",
					RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{}}})
				return err == nil && res.Action == "accept", err
			}
			if ok, err := ask("Draft"); err != nil || !ok {
				return nil, nil, fmt.Errorf("no draft: %v", err)
			}
			record("ask_twice_draft", a.ID) // acts before the second question
			if ok, err := ask("Send"); err != nil || !ok {
				return errorText(fmt.Sprintf("draft of %s kept, not sent (%v)", a.ID, err)), nil, nil
			}
			n := record("ask_twice", a.ID)
			return text(fmt.Sprintf("sent %s, run %d", a.ID, n)), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "ask_sample_later", Description: "waits for release-ID, then asks the client's model, then acts"},
		func(ctx context.Context, r *mcp.CallToolRequest, a idArgs) (*mcp.CallToolResult, any, error) {
			for !exists("release-" + a.ID) {
				select {
				case <-ctx.Done():
					return nil, nil, ctx.Err()
				case <-time.After(5 * time.Millisecond):
				}
			}
			if _, err := r.Session.CreateMessage(ctx, &mcp.CreateMessageParams{MaxTokens: 10,
				Messages: []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: "name " + a.ID}}}}); err != nil {
				return nil, nil, fmt.Errorf("sample: %w", err)
			}
			n := record("ask_sample_later", a.ID)
			return text(fmt.Sprintf("sampled %s later, run %d", a.ID, n)), nil, nil
		})
}
