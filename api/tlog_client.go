package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// Checkpoint returns the latest signed checkpoint note
// (GET /log/default/checkpoint).
func (c *Client) Checkpoint(ctx context.Context) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.BaseURL+c.logPath()+"checkpoint", nil)
	if err != nil {
		return nil, fmt.Errorf("request: %w", err)
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	res, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET checkpoint: %w", err)
	}
	defer func() { _ = res.Body.Close() }()
	data, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("GET checkpoint: read response: %w", err)
	}
	if res.StatusCode != http.StatusOK {
		var eb errorBody
		if json.Unmarshal(data, &eb) != nil || eb.Error.Code == "" {
			eb.Error.Code, eb.Error.Message = ledger.ECodeInternal, strings.TrimSpace(string(data))
		}
		return nil, &StatusError{Status: res.StatusCode, Err: &ledger.Error{Code: eb.Error.Code,
			Message: eb.Error.Message, Details: eb.Error.Details}}
	}
	return data, nil
}

// PortableReceipt returns receipt seq with its inclusion proof
// (GET /v1/receipts/{seq}/proof).
func (c *Client) PortableReceipt(ctx context.Context, seq uint64) (*tlog.PortableReceipt, error) {
	var p tlog.PortableReceipt
	if err := c.do(ctx, http.MethodGet, "/v1/receipts/"+strconv.FormatUint(seq, 10)+"/proof", nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// ConsistencyProof returns the proof between two checkpointed sizes
// (GET /v1/proof/consistency).
func (c *Client) ConsistencyProof(ctx context.Context, from, to int64) (*tlog.ConsistencyProof, error) {
	var p tlog.ConsistencyProof
	path := fmt.Sprintf("/v1/proof/consistency?from=%d&to=%d", from, to)
	if err := c.do(ctx, http.MethodGet, path, nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}
