package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
)

// This file reads the verifiable log of SPEC §9: signed checkpoints and
// the proofs against them. The client hands them over as the ledger sent
// them; a verifier checks them with the verifier key.

// Checkpoint returns the latest signed checkpoint of the client's
// namespace, a signed note (GET /log/{ns}/checkpoint). Errors:
// ErrNotFound when the server signs no checkpoints.
func (c *Client) Checkpoint(ctx context.Context) ([]byte, error) {
	res, err := c.sendTo(ctx, http.MethodGet, "/log/"+url.PathEscape(c.Namespace())+"/checkpoint", nil)
	if err != nil {
		return nil, err
	}
	return res.body, nil
}

// ReceiptProof returns the portable receipt of the receipt at seq: the
// receipt, its inclusion proof and the checkpoint it is proven against,
// as JSON (GET /v1/receipts/{seq}/proof). Errors: ErrUnknownReceipt, and
// not_checkpointed while no checkpoint covers it yet.
func (c *Client) ReceiptProof(ctx context.Context, seq uint64) (json.RawMessage, error) {
	return c.receiptProof(ctx, seq, "")
}

// ReceiptProofErasedBy is ReceiptProof with "erased_by" (SPEC §14): when
// fields of the receipt were erased, the erase receipt, its inclusion
// proof and the erased ranges' opening, so that check-proof shows them
// "erased by S". The ranges name every receipt erased together: an admin
// token only (ErrForbidden otherwise), and not_checkpointed until a
// checkpoint covers the erase receipt.
func (c *Client) ReceiptProofErasedBy(ctx context.Context, seq uint64) (json.RawMessage, error) {
	return c.receiptProof(ctx, seq, "?erased_by=true")
}

func (c *Client) receiptProof(ctx context.Context, seq uint64, query string) (json.RawMessage, error) {
	res, err := c.send(ctx, http.MethodGet, "/v1/receipts/"+strconv.FormatUint(seq, 10)+"/proof"+query, nil)
	if err != nil {
		return nil, err
	}
	if !json.Valid(res.body) {
		return nil, fmt.Errorf("receipt proof %d: the response is not JSON", seq)
	}
	return res.body, nil
}

// ConsistencyProof returns the proof that the tree of size to extends
// the tree of size from, both checkpointed, as JSON (GET
// /v1/proof/consistency).
func (c *Client) ConsistencyProof(ctx context.Context, from, to int64) (json.RawMessage, error) {
	path := fmt.Sprintf("/v1/proof/consistency?from=%d&to=%d", from, to)
	res, err := c.send(ctx, http.MethodGet, path, nil)
	if err != nil {
		return nil, err
	}
	if !json.Valid(res.body) {
		return nil, fmt.Errorf("consistency proof %d→%d: the response is not JSON", from, to)
	}
	return res.body, nil
}

// InclusionProof returns the proof that receipt seq is in the
// checkpointed tree of size size (the latest checkpoint when 0), as JSON
// (GET /v1/proof/inclusion): it answers for a pruned receipt too, whose
// hash the ledger keeps (SPEC §16).
func (c *Client) InclusionProof(ctx context.Context, seq uint64, size int64) (json.RawMessage, error) {
	path := fmt.Sprintf("/v1/proof/inclusion?seq=%d", seq)
	if size > 0 {
		path += fmt.Sprintf("&size=%d", size)
	}
	res, err := c.send(ctx, http.MethodGet, path, nil)
	if err != nil {
		return nil, err
	}
	if !json.Valid(res.body) {
		return nil, fmt.Errorf("inclusion proof %d: the response is not JSON", seq)
	}
	return res.body, nil
}
