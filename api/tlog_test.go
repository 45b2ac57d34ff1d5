package api_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
	"github.com/effect-ledger/effect-ledger/tlog"
)

func TestServer_log(t *testing.T) {
	t.Parallel()
	db := ledgertest.Open(t, ledgertest.WithNow(time.Now))
	ctx := context.Background()
	open := MustServe(t, api.NewServer(db.Ledger, api.Config{Logger: quiet}))
	res, body := get(t, open.URL+"/log/default/checkpoint")
	assert.Equal(t, 404, res.StatusCode, body)
	assert.Contains(t, body, `"not_checkpointed"`)

	for i := range 3 {
		r := do(t, open, "POST", "/v1/effects/reserve", fmt.Sprintf(`{"idempotency_key":"key-log-%04d","execution_id":"e","tool":"t","effect":"write"}`, i))
		require.Equal(t, 201, r.status, r.raw)
	}
	skey, vkey, err := tlog.GenerateKey("ex.test")
	require.NoError(t, err)
	signer, _, _, err := tlog.LoadSignerText(skey, "ex.test")
	require.NoError(t, err)
	s, err := (&tlog.Checkpointer{Store: db, Signer: signer, Origin: "ex.test/default"}).SignOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(3), s.Size)

	res, body = get(t, open.URL+"/log/default/checkpoint")
	require.Equal(t, 200, res.StatusCode, body)
	assert.Equal(t, "text/plain; charset=utf-8", res.Header.Get("Content-Type"))
	v, err := tlog.NewVerifier(vkey)
	require.NoError(t, err)
	c, err := tlog.OpenCheckpoint([]byte(body), v, "default")
	require.NoError(t, err)
	assert.Equal(t, s.Root, c.Root)

	res, body = get(t, open.URL+"/log/default/tile/0/000.p/3")
	require.Equal(t, 200, res.StatusCode, body)
	assert.Len(t, body, 3*32)
	assert.Equal(t, "no-cache", res.Header.Get("Cache-Control"), "a partial tile may be superseded by a wider one")

	r := do(t, open, "GET", "/v1/receipts/2/proof", "")
	require.Equal(t, 200, r.status, r.raw)
	assert.Equal(t, float64(1), r.body["leaf_index"])
	r = do(t, open, "GET", "/v1/receipts/abc/proof", "")
	assert.Equal(t, "unknown_receipt", r.code())
	r = do(t, open, "GET", "/v1/proof/inclusion?seq=1&seq=2", "")
	assert.Equal(t, "invalid_request", r.code(), "one seq")
	assert.Equal(t, "seq", r.field())
	r = do(t, open, "GET", "/v1/proof/inclusion?seq=1&size=0", "")
	assert.Equal(t, "invalid_request", r.code())
	assert.Equal(t, "size", r.field())
	r = do(t, open, "POST", "/v1/proof/inclusion?seq=1", "")
	assert.Equal(t, 405, r.status)

	// With auth on, the log routes need a token unless the log is public;
	// the proofs are API routes either way.
	for _, public := range []bool{false, true} {
		srv := api.NewServer(db.Ledger, api.Config{Logger: quiet, PublicLog: public})
		srv.RequireAuth()
		hs := MustServe(t, srv)
		for path, open := range map[string]bool{
			"/log/default/checkpoint":           public,
			"/log/default/tile/0/000.p/3":       public,
			"/log/default/tile/entries/000.p/3": public,
			"/v1/proof/inclusion?seq=1":         false,
			"/v1/receipts/1/proof":              false,
		} {
			res, body := get(t, hs.URL+path)
			if open {
				assert.Equal(t, 200, res.StatusCode, "%s public=%v: %s", path, public, body)
			} else {
				assert.Equal(t, 401, res.StatusCode, "%s public=%v: %s", path, public, body)
			}
		}
	}
}
