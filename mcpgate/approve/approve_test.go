package approve_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/mcpgate/approve"
	"github.com/effect-ledger/effect-ledger/mcpgate/ledgerport"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

// path is the call's path as the core runs it, over a real ledger: what
// the extension asked of it is kept.
type path struct {
	port   ledgerport.Port
	r      client.ReserveRequest
	waits  []bool // each Reserve's wait
	person *ledgerport.Reservation
	form   *mcp.ElicitParams
	rsv    *ledgerport.Reservation // what Decide got
	err    error
	why    string
}

func (p *path) Reserve(ctx context.Context, wait bool) (*ledgerport.Reservation, error) {
	p.waits = append(p.waits, wait)
	r := p.r
	if !wait {
		r.Wait = 0
	}
	return p.port.Reserve(ctx, r)
}

func (p *path) Decide(_ context.Context, rsv *ledgerport.Reservation, err error, why string) (mcp.Result, error) {
	p.rsv, p.err, p.why = rsv, err, why
	return &mcp.CallToolResult{}, nil
}

func (p *path) Person(rsv *ledgerport.Reservation) mcp.Result {
	p.person = rsv
	return &mcp.CallToolResult{}
}

func (p *path) Round(_ *ledgerport.Reservation, form *mcp.ElicitParams) (mcp.Result, error) {
	p.form = form
	return &mcp.CallToolResult{}, nil
}

// setup is an embedded ledger under policy, the extension over it and a
// 2026-07-28 client's call of shop.charge that takes form elicitations.
func setup(t *testing.T, policy string) (*approve.Approvals, approve.Call, *path) {
	t.Helper()
	ns := ledgertest.Open(t, ledgertest.WithNow(time.Now)).Namespace
	_, err := ns.SetPolicy(context.Background(), json.RawMessage(policy), "")
	require.NoError(t, err)
	port := ledgerport.Port{Ledger: ledgerport.NewLocal(ns)}
	a := approve.New(port, "https://ledger.example/ui/", time.Second, slog.New(slog.DiscardHandler))
	c := approve.Call{Key: "approve-key-1", LedgerTool: "shop.charge", Effect: "external", Args: json.RawMessage(`{"amount":12}`),
		Client: "agent", ElicitForm: true, Stateless: true}
	r := client.ReserveRequest{Key: c.Key, ExecutionID: "exec-1", Tool: c.LedgerTool, Class: client.ClassExternal,
		Input: c.Args, Lease: time.Minute, Wait: time.Second}
	return a, c, &path{port: port, r: r}
}

const byClient = `{"rules":[{"tool":"shop.charge","approval":"required","approvers":["mcp-client"]}],"self_approval":"allow"}`

// TestApprovals_byClient: a call its client may approve is reserved
// without waiting, asked of a 2026-07-28 client with a round, and its
// client's accept is recorded, so the reserve after it consumes the
// approval.
func TestApprovals_byClient(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, c, p := setup(t, byClient)
	rsv, unwaited, err := a.Reserve(ctx, c, p.r)
	require.NoError(t, err)
	require.Equal(t, ledger.StatusApprovalRequired, rsv.Status)
	assert.True(t, unwaited, "the client is asked at once, not after the wait")

	_, err = a.Required(ctx, c, p, rsv, unwaited)
	require.NoError(t, err)
	require.NotNil(t, p.form, "a 2026-07-28 client is asked with a round")
	assert.Contains(t, p.form.Message, "shop.charge")
	assert.Nil(t, p.person)

	answer := mcp.InputResponseMap{approve.InputID: &mcp.ElicitResult{Action: "accept", Content: map[string]any{"note": "fine"}}}
	_, err = a.Answered(ctx, c, p, rsv.Ask.Seq, answer)
	require.NoError(t, err)
	require.NoError(t, p.err)
	assert.Empty(t, p.why)
	assert.Equal(t, []bool{false}, p.waits, "the reserve after the client's answer does not wait")
	require.Equal(t, ledger.StatusReserved, p.rsv.Status)
	require.NotNil(t, p.rsv.Approval, "the client's approval is consumed")
	assert.Equal(t, rsv.Ask.Seq, p.rsv.Approval.AskSeq)
}

// TestApprovals_person: a rule that wants a person never asks the client;
// the model is told who must answer, and where.
func TestApprovals_person(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, c, p := setup(t, `{"rules":[{"tool":"shop.charge","approval":"required","approvers":["role:ops"]}]}`)
	p.r.Wait = 0 // a person's answer is not waited for here
	rsv, unwaited, err := a.Reserve(ctx, c, p.r)
	require.NoError(t, err)
	require.Equal(t, ledger.StatusApprovalRequired, rsv.Status)
	assert.False(t, unwaited)
	_, err = a.Required(ctx, c, p, rsv, unwaited)
	require.NoError(t, err)
	assert.Nil(t, p.form, "the client is not asked")
	require.Same(t, rsv, p.person)

	text, meta := a.PersonText(rsv, "")
	assert.Contains(t, text, "was NOT run")
	assert.Contains(t, text, a.URL(rsv.Ask.Seq))
	assert.Equal(t, rsv.Ask.Seq, meta["seq"])
	assert.Equal(t, a.URL(rsv.Ask.Seq), meta["url"])
}

// TestApprovals_missingAnswer: a round whose answer is missing records
// nothing and decides the call again, saying why.
func TestApprovals_missingAnswer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, c, p := setup(t, byClient)
	rsv, _, err := a.Reserve(ctx, c, p.r)
	require.NoError(t, err)
	_, err = a.Answered(ctx, c, p, rsv.Ask.Seq, nil)
	require.NoError(t, err)
	assert.Contains(t, p.why, "could not be asked")
	require.NotNil(t, p.rsv)
	assert.Equal(t, ledger.StatusApprovalRequired, p.rsv.Status, "the ask still awaits its answer")
}

func TestApprovals_URL(t *testing.T) {
	t.Parallel()
	port := ledgerport.Port{}
	assert.Equal(t, "https://l.example/ui/#approvals/7", approve.New(port, "https://l.example/ui/", 0, nil).URL(7))
	assert.Equal(t, "https://l.example/a/7/x", approve.New(port, "https://l.example/a/{seq}/x", 0, nil).URL(7))
	assert.Empty(t, approve.New(port, "", 0, nil).URL(7))
}
