package mcpgate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/mcpgate/ledgerport"
	"github.com/effect-ledger/effect-ledger/mcpgate/policy"
)

// TestMetaSubjects: _meta["io.effect-ledger/subjects"] is an array of at
// most 8 strings of 1–128 bytes, or absent; anything else is invalid
// params, and the message never echoes the value.
func TestMetaSubjects(t *testing.T) {
	t.Parallel()
	got, err := metaSubjects(mcp.Meta{MetaSubjects: []any{"cust-42", "rcpt-9"}})
	require.NoError(t, err)
	assert.Equal(t, []string{"cust-42", "rcpt-9"}, got)
	got, err = metaSubjects(mcp.Meta{"other": 1})
	require.NoError(t, err)
	assert.Nil(t, got)

	secret := "zoe@example.com"
	nine := make([]any, 9)
	for i := range nine {
		nine[i] = secret
	}
	for _, v := range []any{secret, []any{secret, 7.0}, []any{""}, []any{secret + strings.Repeat("x", 128)}, nine,
		map[string]any{"s": secret}, nil, true, []any{[]any{secret}}, []any{"\xff"}} {
		_, err := metaSubjects(mcp.Meta{MetaSubjects: v})
		var rpc *jsonrpc.Error
		require.True(t, errors.As(err, &rpc), "%#v: %v", v, err)
		assert.EqualValues(t, jsonrpc.CodeInvalidParams, rpc.Code)
		assert.Contains(t, rpc.Message, MetaSubjects)
		assert.NotContains(t, rpc.Message, "zoe", "the message never echoes the value")
	}
}

// TestSubjectsOf: a call's subjects are its rule's, rendered (the
// operator's, first), then the client's, deduplicated; a rule's subject
// whose argument is missing or of another type is left out, logged by
// its template only; more than 8 together are invalid params.
func TestSubjectsOf(t *testing.T) {
	t.Parallel()
	pol, err := policy.Parse([]byte(`[{"tool":"crm.*","subjects":["{{arguments.customer_id}}","{{arguments.contact}}","{{arguments.n}}"]}]`))
	require.NoError(t, err)
	var logs bytes.Buffer
	g := &Gateway{cfg: Config{Policy: pol}, logger: slog.New(slog.NewTextHandler(&logs, nil))}
	c := &call{request: request{name: "crm.upsert", ledgerTool: "srv.crm.upsert",
		args:         json.RawMessage(`{"customer_id":"cust-42","contact":{"email":"zoe@example.com"},"n":17}`),
		metaSubjects: []string{"rcpt-9", "cust-42"}}}
	got, err := g.subjectsOf(context.Background(), c, "dk_1")
	require.NoError(t, err)
	assert.Equal(t, []string{"cust-42", "17", "rcpt-9"}, got)
	assert.Contains(t, logs.String(), "{{arguments.contact}}", "logged by its template")
	assert.NotContains(t, logs.String(), "zoe", "never by its value")

	c.metaSubjects = []string{"a", "b", "c", "d", "e", "f", "g"}
	_, err = g.subjectsOf(context.Background(), c, "dk_1")
	var rpc *jsonrpc.Error
	require.True(t, errors.As(err, &rpc), "%v", err)
	assert.EqualValues(t, jsonrpc.CodeInvalidParams, rpc.Code)
	assert.Contains(t, rpc.Message, "9 subjects")

	c.name, c.ledgerTool = "mail", "srv.mail"
	got, err = g.subjectsOf(context.Background(), c, "dk_1")
	require.NoError(t, err)
	assert.Equal(t, c.metaSubjects, got, "no rule: the client's alone")
	c.subjects = got
	assert.Equal(t, got, g.reserveOf(c, "dk_1").Subjects, "the reserve carries them")
}

// TestReplay_erased: a replay of a result an erasure removed says so in
// words and carries the erased object in _meta.
func TestReplay_erased(t *testing.T) {
	t.Parallel()
	rsv := &ledgerport.Reservation{Reservation: client.Reservation{Status: "replayed", Key: "dk_1",
		Original: client.ReceiptRef{Seq: 4}, Erased: map[string]uint64{"result": 9, "external_ref": 9}}}
	notice := replayNotice(rsv, ledgerport.Record{}, false)
	assert.Contains(t, notice, "its recorded answer was erased (erase receipt 9")
	res, err := replayAnswer(rsv, notice)
	require.NoError(t, err)
	b, err := json.Marshal(res)
	require.NoError(t, err)
	assert.Contains(t, string(b), `"io.effect-ledger/erased":{"external_ref":9,"result":9}`)
	assert.Contains(t, string(b), "was erased")
	// Not erased: no _meta member.
	plain := &ledgerport.Reservation{Reservation: client.Reservation{Status: "replayed", Key: "dk_1"}}
	res, err = replayAnswer(plain, "")
	require.NoError(t, err)
	b, err = json.Marshal(res)
	require.NoError(t, err)
	assert.NotContains(t, string(b), MetaErased)
}
