package mcpgate

import (
	"context"
	"fmt"
	"slices"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/mcpgate/policy"
)

// Subjects of a call (SPEC §14): opaque ids of the people it concerns,
// which the ledger keeps as HMACs beside the chain so that an erasure by
// subject finds the call's key. A call's are the union, deduplicated, of
// its --policy rule's (rendered from the call's arguments: the
// operator's, first) and the client's own _meta["io.effect-ledger/subjects"];
// more than ledger.MaxSubjects together refuse the call, so that no
// subject is silently dropped. No subject's text reaches a log line or an
// error: they name the template, the index or the count.

// metaSubjects reads the client's _meta["io.effect-ledger/subjects"]: an
// array of at most ledger.MaxSubjects strings of 1–ledger.MaxSubjectLen
// bytes of UTF-8, or absent. Anything else is invalid params.
func metaSubjects(meta mcp.Meta) ([]string, error) {
	v, ok := meta[MetaSubjects]
	if !ok {
		return nil, nil
	}
	list, ok := v.([]any)
	if !ok {
		return nil, subjectsError(" must be an array of strings, not %s", jsonKind(v))
	}
	if len(list) > ledger.MaxSubjects {
		return nil, subjectsError(" holds %d subjects; at most %d", len(list), ledger.MaxSubjects)
	}
	out := make([]string, 0, len(list))
	for i, e := range list {
		s, ok := e.(string)
		if !ok {
			return nil, subjectsError("[%d] must be a string, not %s", i, jsonKind(e))
		}
		if s == "" || len(s) > ledger.MaxSubjectLen || !utf8.ValidString(s) {
			return nil, subjectsError("[%d] must be 1–%d bytes of UTF-8", i, ledger.MaxSubjectLen)
		}
		out = append(out, s)
	}
	return out, nil
}

func subjectsError(format string, args ...any) error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams,
		Message: fmt.Sprintf("_meta[%q]", MetaSubjects) + fmt.Sprintf(format, args...)}
}

// jsonKind names the JSON type of a decoded value, never the value.
func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case float64, int, int64, uint64:
		return "a number"
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	}
	return "a JSON value"
}

// subjectsOf is the union of a recorded call's rule subjects and its
// client's (c.subjects, from metaSubjects), deduplicated, rule's first. A
// rule's subject that renders to none is left out and logged by its
// template; more than ledger.MaxSubjects together are invalid params.
func (g *Gateway) subjectsOf(ctx context.Context, c *call, key string) ([]string, error) {
	var out []string
	for _, t := range g.cfg.Policy.Subjects(c.name, c.ledgerTool) {
		s, err := policy.RenderSubject(t, key, c.args)
		if err != nil {
			g.logger.WarnContext(ctx, "a --policy subject is left out of the call", "tool", c.ledgerTool, "key", key, "err", err)
			continue
		}
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	for _, s := range c.metaSubjects {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	if len(out) > ledger.MaxSubjects {
		return nil, subjectsError(" with the --policy rule's makes %d subjects; at most %d", len(out), ledger.MaxSubjects)
	}
	return out, nil
}
