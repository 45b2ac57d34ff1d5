package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
)

// Resolution is an operator's decision about an interrupted key: what
// really happened to the effect (POST /v1/effects/{key}/resolve).
type Resolution struct {
	Outcome     string          // "succeeded", "failed" or "not_applied"
	ExternalRef string          // the downstream reference; not with "not_applied"
	Result      json.RawMessage // any JSON, with "succeeded"
	Failure     *Failure        // required with "failed" and "not_applied": Code, Message, Retryable
	Note        string          // required: what the operator checked
}

// Resolved is the answer to a resolve.
type Resolved struct {
	Key     string
	State   string // the key's state now
	Receipt ReceiptRef
}

// Resolve records an operator's decision about the interrupted key (an
// admin token when tokens exist). Errors: ErrNotInterrupted,
// ErrUnknownKey, ErrInvalidRequest with details.field naming the member.
func (c *Client) Resolve(ctx context.Context, key string, r Resolution) (*Resolved, error) {
	body := struct {
		Outcome     string          `json:"outcome"`
		ExternalRef string          `json:"external_ref,omitempty"`
		Result      json.RawMessage `json:"result,omitempty"`
		Error       *struct {
			Code      string `json:"code"`
			Message   string `json:"message,omitempty"`
			Retryable bool   `json:"retryable,omitempty"`
		} `json:"error,omitempty"`
		Note string `json:"note"`
	}{Outcome: r.Outcome, ExternalRef: r.ExternalRef, Result: r.Result, Note: r.Note}
	if f := r.Failure; f != nil {
		body.Error = &struct {
			Code      string `json:"code"`
			Message   string `json:"message,omitempty"`
			Retryable bool   `json:"retryable,omitempty"`
		}{f.Code, f.Message, f.Retryable}
	}
	var b struct {
		IdempotencyKey string     `json:"idempotency_key"`
		State          string     `json:"state"`
		Receipt        ReceiptRef `json:"receipt"`
	}
	if _, err := c.exchange(ctx, "resolve", http.MethodPost, c.route("/v1/effects/"+url.PathEscape(key)+"/resolve"), body, &b); err != nil {
		return nil, err
	}
	return &Resolved{Key: b.IdempotencyKey, State: b.State, Receipt: b.Receipt}, nil
}
