package test

import (
	"context"
	"crypto/rand"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLedgerMCP_subjects (SPEC §14): ledger-mcp sends a call's subjects —
// the client's _meta["io.effect-ledger/subjects"] and its --policy rule's
// "subjects" templates rendered from the arguments — to a committed
// namespace, through a ledgerd (--ledger) and through an embedded ledger
// (--db, erased at its --admin-listen). An erasure by either subject
// erases the recorded result: the key's GET shows erased, and the same
// call through ledger-mcp is a replay that says the recorded result was
// erased, with _meta["io.effect-ledger/erased"], and does not run. A
// malformed _meta subjects is invalid params that never echoes it, and
// runs nothing.
func TestLedgerMCP_subjects(t *testing.T) {
	t.Parallel()
	policy := writePolicy(t, `[{"tool": "charge", "subjects": ["cust-{{arguments.order}}", "{{arguments.amount}}", "{{arguments.missing}}"]}]`)
	for name, extra := range map[string][]string{"Remote": nil, "RemoteExactReplays": {"--exact-replays"}} {
		// With --exact-replays too, an erased result is told in words:
		// nothing recorded is left to replay exactly.
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"), "--default-payloads", "committed")
			sh := newShop(t)
			args := append(append([]string{"--ledger", l.URL, "--policy", policy}, extra...), sh.command()...)
			g := startGateway(t, args...)
			checkMCPSubjects(t, g, sh, func(path, body string) (int, map[string]any, string) {
				r := l.Do(map[bool]string{true: "GET", false: "POST"}[body == ""], path, body)
				return r.Status, r.Body, r.Raw
			})
		})
	}
	t.Run("Embedded", func(t *testing.T) {
		t.Parallel()
		db := filepath.Join(t.TempDir(), "mcp.db")
		l := StartLedgerd(t, db, "--default-payloads", "committed") // makes the ledger committed
		require.NoError(t, l.Stop())
		sh := newShop(t)
		g := startGateway(t, append([]string{"--db", db, "--policy", policy, "--admin-listen", "127.0.0.1:0"}, sh.command()...)...)
		admin := "http://" + g.logAddr(t, "admin API ready")
		token := strings.TrimSpace(readFile(t, db+".admin-token"))
		checkMCPSubjects(t, g, sh, func(path, body string) (int, map[string]any, string) {
			if body == "" {
				code, out := getAuthJSON(t, admin+path, token)
				return code, out, fmt.Sprint(out)
			}
			code, out := postAuthJSON(t, admin+path, token, body)
			return code, out, fmt.Sprint(out)
		})
	})
}

// checkMCPSubjects is TestLedgerMCP_subjects against one ledger, which
// do reaches (a GET with an empty body, else a POST).
func checkMCPSubjects(t *testing.T, g *gateway, sh *shop, do func(path, body string) (int, map[string]any, string)) {
	t.Helper()
	marker := rand.Text()
	erase := func(subject string) uint64 {
		t.Helper()
		code, body, raw := do("/v1/erasures", `{"subject":"`+subject+`"}`)
		require.Equal(t, 201, code, raw)
		return uint64(body["receipt"].(map[string]any)["seq"].(float64))
	}
	for _, tc := range []struct {
		name, order, subject string
		meta                 mcp.Meta
	}{
		{"meta", "M" + marker, "person-" + marker, mcp.Meta{"io.effect-ledger/subjects": []any{"person-" + marker, "team-7"}}},
		{"policy", "P" + marker, "cust-P" + marker, nil},
		{"policy number", "N" + marker, "4200", nil},
	} {
		key := "subj-" + strings.ReplaceAll(tc.name, " ", "-") + "-" + marker
		meta := mcp.Meta{"io.effect-ledger/idempotency-key": key}
		for k, v := range tc.meta {
			meta[k] = v
		}
		args := map[string]any{"order": tc.order}
		if tc.name == "policy number" {
			args["amount"] = 4200
		}
		first := g.call(t, "charge", args, meta)
		require.False(t, first.IsError, "%s: %s", tc.name, text(t, first))
		assert.Contains(t, text(t, first), "ch_"+tc.order, tc.name)

		seq := erase(tc.subject)
		code, _, raw := do("/v1/effects/"+key, "")
		require.Equal(t, 200, code, raw)
		assert.NotContains(t, raw, "ch_"+tc.order, tc.name)
		assert.Contains(t, raw, "erased", tc.name)

		replay := g.call(t, "charge", args, meta)
		assert.Equal(t, true, replay.Meta["io.effect-ledger/replayed"], "%s: %s", tc.name, text(t, replay))
		assert.Equal(t, map[string]any{"result": float64(seq)}, replay.Meta["io.effect-ledger/erased"], tc.name)
		assert.Contains(t, text(t, replay), fmt.Sprintf("its recorded answer was erased (erase receipt %d", seq), tc.name)
		assert.NotContains(t, text(t, replay), "ch_"+tc.order, tc.name)
		assert.Equal(t, 1, sh.runs("charge", tc.order), "%s: the replay did not run", tc.name)
	}

	// Malformed _meta subjects: invalid params, nothing runs, nothing echoed.
	secret := "zoe@example.com"
	for _, v := range []any{secret, []any{secret, 7}, []any{""}} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err := g.CallTool(ctx, &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{"order": "BAD" + marker},
			Meta: mcp.Meta{"io.effect-ledger/subjects": v}})
		cancel()
		require.Error(t, err, "%v", v)
		assert.Contains(t, err.Error(), "io.effect-ledger/subjects")
		assert.NotContains(t, err.Error(), "zoe")
	}
	assert.Zero(t, sh.runs("charge", "BAD"+marker))
	assert.NotContains(t, g.logs.String(), secret, "no log line quotes a subject")
	assert.NotContains(t, g.logs.String(), "person-"+marker, "no log line quotes a subject")
}
