package main

import (
	"context"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// addLaterTools adds ask_sample_later, which asks its client's model
// only once the file release-ID exists in --dir: for the test of two
// calls at once, whose requests must each reach their own call.
func addLaterTools(s *mcp.Server) {
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
