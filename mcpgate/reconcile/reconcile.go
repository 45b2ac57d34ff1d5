// Package reconcile is the MCP gateway's side of reconciling an unknown
// outcome (SPEC §15): a --policy rule's lookup, a read-only tool of the
// upstream, asked once whether an interrupted call applied, and what its
// answer is worth as evidence. Only a structuredContent of {"applied":
// true, "external_ref": "…"} or {"applied": false} is evidence, and "not
// applied" only from a lookup by the call's idempotency key; anything else
// (an error, another answer, no answer) records nothing and leaves the key
// to a person. The gateway's core asks the ledger to record it
// (mcpgate/reconcile.go).
package reconcile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// CodeNotFound is the error code of a reconcile not_applied: the lookup by
// the call's key found nothing.
const CodeNotFound = "LOOKUP_NOT_FOUND"

// Bounds of what the ledger records (SPEC §15 and §4).
const (
	MaxAnswer      = 16 << 10 // the lookup's answer in the evidence
	MaxExternalRef = 512
)

// ErrNoEvidence: the lookup's answer says neither that the call applied
// nor (by key) that it did not.
var ErrNoEvidence = errors.New("the lookup's answer is no evidence")

// Finding is what a lookup's answer is evidence of.
type Finding struct {
	Applied     bool
	ExternalRef string
	// Answer is the lookup's structuredContent, as the upstream sent it:
	// the evidence's answer.
	Answer json.RawMessage
}

// Judge reads the raw result of a lookup: a structuredContent object whose
// "applied" is true with a non-empty "external_ref" string, or false when
// the lookup asked by the call's key (byKey); any other answer, an
// isError result among them, is ErrNoEvidence.
func Judge(raw json.RawMessage, byKey bool) (Finding, error) {
	var res struct {
		IsError           bool            `json:"isError"`
		StructuredContent json.RawMessage `json:"structuredContent"`
	}
	if err := json.Unmarshal(raw, &res); err != nil {
		return Finding{}, fmt.Errorf("%w: %w", ErrNoEvidence, err)
	}
	if res.IsError {
		return Finding{}, fmt.Errorf("%w: the lookup answered an error", ErrNoEvidence)
	}
	var found struct {
		Applied     *bool   `json:"applied"`
		ExternalRef *string `json:"external_ref"`
	}
	if t := bytes.TrimSpace(res.StructuredContent); len(t) == 0 || t[0] != '{' || json.Unmarshal(t, &found) != nil || found.Applied == nil {
		return Finding{}, fmt.Errorf("%w: no structuredContent {\"applied\": true|false}", ErrNoEvidence)
	}
	answer := compact(res.StructuredContent)
	if len(answer) > MaxAnswer {
		return Finding{}, fmt.Errorf("%w: the answer is over %d bytes", ErrNoEvidence, MaxAnswer)
	}
	switch {
	case *found.Applied && (found.ExternalRef == nil || *found.ExternalRef == "" || len(*found.ExternalRef) > MaxExternalRef):
		return Finding{}, fmt.Errorf("%w: \"applied\": true without an \"external_ref\" of 1–%d bytes", ErrNoEvidence, MaxExternalRef)
	case *found.Applied:
		return Finding{Applied: true, ExternalRef: *found.ExternalRef, Answer: answer}, nil
	case !byKey:
		return Finding{}, fmt.Errorf("%w: \"applied\": false from a lookup that does not ask by {{key}}", ErrNoEvidence)
	}
	return Finding{Answer: answer}, nil
}

// compact is raw without insignificant whitespace.
func compact(raw json.RawMessage) json.RawMessage {
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return raw
	}
	return b.Bytes()
}

// CheckTool refuses a lookup tool the upstream does not list, or does not
// annotate readOnlyHint: true: a lookup must not act.
func CheckTool(name string, t *mcp.Tool) error {
	switch {
	case t == nil:
		return fmt.Errorf("the lookup tool %q is not one of the upstream's tools", name)
	case t.Annotations == nil || !t.Annotations.ReadOnlyHint:
		return fmt.Errorf("the lookup tool %q is not annotated readOnlyHint: true by the upstream: a lookup must not act, "+
			"so a tool that may is never called as one", name)
	}
	return nil
}
