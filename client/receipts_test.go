package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/client"
)

const hashA = "1111111111111111111111111111111111111111111111111111111111111111"

func TestClient_Receipts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r1 := `{"seq":1,"kind":"reserve","idempotency_key":"k-order-1234","hash":"` + hashA + `"}`
	r2 := `{"seq":2,"kind":"commit","idempotency_key":"k-order-1234","outcome":"succeeded","result":{"b": 1}}`
	srv, _ := approverLedger(t, map[string]route{
		"GET /v1/ns/payments/receipts?after=0&limit=2": {200, `{"receipts":[` + r1 + `,` + r2 + `],"next_after":2}`},
		"GET /v1/ns/payments/receipts?after=2&limit=2": {200, `{"receipts":[],"next_after":null}`},
		"GET /v1/receipts?after=0&key=k-order-1234":    {200, `{"receipts":[` + r1 + `],"next_after":null}`},
		"GET /v1/ns/payments/receipts?after=0&kind=x":  {400, `{"error":{"code":"invalid_request","message":"unknown kind","details":{"field":"kind"}}}`},
	})
	c, err := client.New(srv.URL, client.WithNamespace("payments"))
	require.NoError(t, err)

	t.Run("OK pages in the client's namespace, each receipt verbatim", func(t *testing.T) {
		page, next, err := c.Receipts(ctx, client.ReceiptFilter{Limit: 2})
		require.NoError(t, err)
		assert.Equal(t, uint64(2), next)
		require.Len(t, page, 2)
		assert.JSONEq(t, r1, string(page[0]))
		assert.Equal(t, r2, string(page[1]), "the bytes the ledger sent")
		page, next, err = c.Receipts(ctx, client.ReceiptFilter{After: 2, Limit: 2})
		require.NoError(t, err)
		assert.Zero(t, next)
		assert.Empty(t, page)
	})
	t.Run("OK filters", func(t *testing.T) {
		d, err := client.New(srv.URL)
		require.NoError(t, err)
		page, next, err := d.Receipts(ctx, client.ReceiptFilter{Key: "k-order-1234"})
		require.NoError(t, err)
		assert.Zero(t, next)
		assert.Len(t, page, 1)
	})
	t.Run("ErrInvalidRequest names the field", func(t *testing.T) {
		_, _, err := c.Receipts(ctx, client.ReceiptFilter{Kind: "x"})
		require.ErrorIs(t, err, client.ErrInvalidRequest)
		var e *client.Error
		require.ErrorAs(t, err, &e)
		assert.Equal(t, 400, e.Status)
		assert.Equal(t, "kind", e.Details["field"])
	})
}

func TestClient_Head(t *testing.T) {
	t.Parallel()
	srv, _ := approverLedger(t, map[string]route{
		"GET /v1/head": {200, `{"seq":7,"hash":"` + hashA + `"}`},
	})
	c, err := client.New(srv.URL)
	require.NoError(t, err)
	got, err := c.Head(context.Background())
	require.NoError(t, err)
	assert.Equal(t, client.ReceiptRef{Seq: 7, Hash: hashA}, got)
}

func TestClient_Key_receiptJSON(t *testing.T) {
	t.Parallel()
	r1 := `{"seq":1,"kind":"reserve","tool":"payments.charge","note":"","hash":"` + hashA + `"}`
	srv, _ := approverLedger(t, map[string]route{
		"GET /v1/effects/k-order-1234": {200, `{"idempotency_key":"k-order-1234","state":"reserved","receipts":[` + r1 + `]}`},
	})
	c, err := client.New(srv.URL)
	require.NoError(t, err)
	v, err := c.Key(context.Background(), "k-order-1234", false)
	require.NoError(t, err)
	require.Len(t, v.Receipts, 1)
	assert.Equal(t, uint64(1), v.Receipts[0].Seq)
	assert.Equal(t, r1, string(v.Receipts[0].JSON))
}

func TestClient_Resolve(t *testing.T) {
	t.Parallel()
	srv, bodies := approverLedger(t, map[string]route{
		"POST /v1/effects/k-order-1234/resolve": {200, `{"status":"resolved","idempotency_key":"k-order-1234","state":"failed","receipt":{"seq":9,"hash":"` + hashA + `"}}`},
	})
	c, err := client.New(srv.URL)
	require.NoError(t, err)
	got, err := c.Resolve(context.Background(), "k-order-1234", client.Resolution{Outcome: "failed",
		Failure: &client.Failure{Code: "NOT_CHARGED"}, Note: "no charge at the PSP"})
	require.NoError(t, err)
	assert.Equal(t, &client.Resolved{Key: "k-order-1234", State: "failed", Receipt: client.ReceiptRef{Seq: 9, Hash: hashA}}, got)
	assert.JSONEq(t, `{"outcome":"failed","error":{"code":"NOT_CHARGED"},"note":"no charge at the PSP"}`,
		bodies("POST /v1/effects/k-order-1234/resolve"))
}

func TestClient_Namespaces(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, bodies := approverLedger(t, map[string]route{
		"GET /v1/namespaces":  {200, `{"namespaces":[{"name":"default","head":{"seq":0,"hash":"` + hashA + `"},"key_ttl_ms":0},{"name":"payments","head":{"seq":3,"hash":"` + hashA + `"},"key_ttl_ms":86400000}]}`},
		"POST /v1/namespaces": {201, `{"name":"mail","head":{"seq":0,"hash":"` + hashA + `"},"key_ttl_ms":60000}`},
	})
	c, err := client.New(srv.URL, client.WithNamespace("payments")) // the routes are never prefixed
	require.NoError(t, err)

	t.Run("OK list", func(t *testing.T) {
		list, err := c.Namespaces(ctx)
		require.NoError(t, err)
		require.Len(t, list, 2)
		assert.Equal(t, client.NamespaceInfo{Name: "payments", Head: client.ReceiptRef{Seq: 3, Hash: hashA}, KeyTTLMS: 86400000}, list[1])
	})
	t.Run("OK create", func(t *testing.T) {
		n, err := c.CreateNamespace(ctx, "mail", 60000)
		require.NoError(t, err)
		assert.Equal(t, "mail", n.Name)
		assert.Equal(t, uint64(60000), n.KeyTTLMS)
		assert.JSONEq(t, `{"name":"mail","key_ttl_ms":60000}`, bodies("POST /v1/namespaces"))
	})
}

func TestClient_Checkpoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	note := "ledger.example.com/default\n3\nAAAA\n\n— ledger.example.com xyz\n"
	srv, _ := approverLedger(t, map[string]route{
		"GET /log/payments/checkpoint":          {200, note},
		"GET /log/default/checkpoint":           {404, `{"error":{"code":"not_found","message":"no checkpoints"}}`},
		"GET /v1/ns/payments/receipts/2/proof":  {200, `{"receipt":{"seq":2},"proof":[]}`},
		"GET /v1/proof/consistency?from=1&to=3": {200, `{"from":1,"to":3,"hashes":[]}`},
	})
	c, err := client.New(srv.URL, client.WithNamespace("payments"))
	require.NoError(t, err)

	t.Run("OK the note as sent", func(t *testing.T) {
		got, err := c.Checkpoint(ctx)
		require.NoError(t, err)
		assert.Equal(t, note, string(got))
	})
	t.Run("OK proofs as JSON", func(t *testing.T) {
		p, err := c.ReceiptProof(ctx, 2)
		require.NoError(t, err)
		assert.True(t, json.Valid(p))
		d, err := client.New(srv.URL)
		require.NoError(t, err)
		cp, err := d.ConsistencyProof(ctx, 1, 3)
		require.NoError(t, err)
		assert.JSONEq(t, `{"from":1,"to":3,"hashes":[]}`, string(cp))
	})
	t.Run("ErrNotFound", func(t *testing.T) {
		d, err := client.New(srv.URL)
		require.NoError(t, err)
		_, err = d.Checkpoint(ctx)
		assert.True(t, errors.Is(err, client.ErrNotFound), "%v", err)
	})
}
