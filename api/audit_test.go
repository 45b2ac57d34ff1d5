package api_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"net/http/httptest"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
	"github.com/effect-ledger/effect-ledger/verify"
)

// fillAudit records, through srv, a replay by a new execution, a runtime
// retry after a failure, a duplicate effect and a non-retryable failure.
func fillAudit(t *testing.T, post func(path, body string) response) {
	t.Helper()
	reserve := func(key, exec string, attempt int, tool string, input string) string {
		r := post("/v1/effects/reserve", `{"idempotency_key":"`+key+`","execution_id":"`+exec+`","attempt":`+strconv.Itoa(attempt)+
			`,"tool":"`+tool+`","effect":"write","idempotent":true,"input":`+input+`}`)
		require.Contains(t, []int{200, 201}, r.status, r.raw)
		s, _ := r.body["reservation"].(string)
		return s
	}
	commit := func(key, rsv, body string) {
		r := post("/v1/effects/"+url.PathEscape(key)+"/commit", `{"reservation":"`+rsv+`",`+body+`}`)
		require.Equal(t, 201, r.status, r.raw)
	}
	commit("refund-0001", reserve("refund-0001", "exec-1", 1, "payments.refund", `{"order":1}`), `"outcome":"succeeded","external_ref":"re_1"`)
	reserve("refund-0001", "exec-2", 1, "payments.refund", `{"order":1}`) // replayed
	commit("refund-0002", reserve("refund-0002", "exec-3", 1, "payments.refund", `{"order":1}`), `"outcome":"succeeded","external_ref":"re_2"`)
	commit("mail-00001", reserve("mail-00001", "exec-4", 1, "email.send", `{"to":"a"}`), `"outcome":"failed","error":{"code":"TIMEOUT","retryable":true}`)
	commit("mail-00001", reserve("mail-00001", "exec-4", 2, "email.send", `{"to":"a"}`), `"outcome":"succeeded"`)
	commit("charge-0001", reserve("charge-0001", "exec-5", 1, "payments.charge", `{"card":1}`), `"outcome":"failed","error":{"code":"CARD_DECLINED"}`)
}

// tamperFile drops the append-only trigger of the ledger at path and
// edits one receipt, breaking its hash.
func tamperFile(t *testing.T, path string, seq int) {
	t.Helper()
	testkit.EditLedger(t, path, func(db *sql.DB) {
		_, err := db.Exec(`UPDATE receipts SET actor = '<b>forged</b>' WHERE seq = ?`, seq)
		require.NoError(t, err)
	})
}

func TestServer_audit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := ledgertest.Open(t, ledgertest.WithNow(time.Now))
	path := db.Path()
	srv := MustServe(t, api.NewServer(db.Ledger, api.Config{Logger: quiet}))
	post := func(p, body string) response { return do(t, srv, "POST", p, body) }
	fillAudit(t, post)

	t.Run("OK", func(t *testing.T) {
		r := do(t, srv, "GET", "/v1/audit", "")
		require.Equal(t, 200, r.status, r.raw)
		assert.Equal(t, "0", r.header.Get("Ledger-Violations"))
		rd, err := sqlite.OpenReader(ctx, path, sqlite.Options{})
		require.NoError(t, err)
		defer rd.Close()
		rep, err := verify.New(rd, verify.Opts{}).Check(ctx)
		require.NoError(t, err)
		want, err := json.Marshal(rep.Audit)
		require.NoError(t, err)
		var wantBody map[string]any
		require.NoError(t, json.Unmarshal(want, &wantBody))
		assert.Equal(t, wantBody, r.body, "the JSON of ledgerctl audit --json")
		for _, m := range []string{"runtime_retries", "re_invocations", "duplicate_effects", "failed"} {
			assert.Len(t, r.body[m], 1, m)
		}
	})

	t.Run("OKFilters", func(t *testing.T) {
		r := do(t, srv, "GET", "/v1/audit?tool=email.send", "")
		require.Equal(t, 200, r.status, r.raw)
		assert.Len(t, r.body["runtime_retries"], 1)
		assert.Empty(t, r.body["re_invocations"])
		assert.Empty(t, r.body["failed"])
		future := url.QueryEscape(time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
		for _, q := range []string{"since=" + future, "since=1000"} {
			r = do(t, srv, "GET", "/v1/audit?"+q, "")
			require.Equal(t, 200, r.status, r.raw)
			for m, l := range r.body {
				assert.Empty(t, l, "%s: %s", q, m)
			}
		}
		for _, q := range []string{"since=24h", "since=11"} {
			r = do(t, srv, "GET", "/v1/audit?"+q, "")
			require.Equal(t, 200, r.status, r.raw)
			assert.Len(t, r.body["failed"], 1, q)
		}
		r = do(t, srv, "HEAD", "/v1/audit", "")
		assert.Equal(t, 200, r.status)
	})

	t.Run("ErrBadQuery", func(t *testing.T) {
		for _, tt := range []struct{ desc, query, field string }{
			{"bad since", "since=yesterday", "since"},
			{"negative since", "since=-1h", "since"},
			{"unknown parameter", "limit=3", "limit"},
			{"repeated parameter", "tool=a&tool=b", "tool"},
		} {
			r := do(t, srv, "GET", "/v1/audit?"+tt.query, "")
			assert.Equal(t, 400, r.status, tt.desc)
			assert.Equal(t, "invalid_request", r.code(), tt.desc)
			assert.Equal(t, tt.field, r.field(), tt.desc)
		}
		r := do(t, srv, "POST", "/v1/audit", "{}")
		assert.Equal(t, 405, r.status)
	})

	t.Run("ErrViolations", func(t *testing.T) {
		tamperFile(t, path, 2)
		r := do(t, srv, "GET", "/v1/audit", "")
		require.Equal(t, 200, r.status, r.raw)
		assert.Equal(t, "1", r.header.Get("Ledger-Violations"))
	})
}

func TestServer_auditStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := ledgertest.Open(t, ledgertest.WithNow(time.Now))
	path := db.Path()
	require.NoError(t, db.Ledger.CreateNamespace(ctx, "pay", ledger.NamespaceSettings{}))
	rs, err := sqlite.OpenStore(ctx, path, sqlite.Options{}, true)
	require.NoError(t, err)
	s := api.NewServer(db.Ledger, api.Config{Logger: quiet, AuditStore: rs})
	srv := MustServe(t, s)
	fillAudit(t, func(p, body string) response { return do(t, srv, "POST", p, body) })
	r := do(t, srv, "GET", "/v1/audit", "")
	require.Equal(t, 200, r.status, r.raw)
	assert.Len(t, r.body["duplicate_effects"], 1)
	r = do(t, srv, "GET", "/v1/ns/pay/audit", "")
	require.Equal(t, 200, r.status, r.raw)
	assert.Empty(t, r.body["duplicate_effects"], "a namespace's audit reads that namespace, not the default one")

	require.NoError(t, rs.Close())
	r = do(t, srv, "GET", "/v1/audit", "")
	assert.GreaterOrEqual(t, r.status, 500, "the audit's own store is gone")
	assert.NotContains(t, r.raw, path, "no internals")
}

func TestServer_verification(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("OKOff", func(t *testing.T) {
		srv, _ := MustOpenServer(t)
		r := do(t, srv, "GET", "/v1/verification", "")
		require.Equal(t, 200, r.status, r.raw)
		assert.Equal(t, map[string]any{"enabled": false, "every_ms": 0.0, "ran": false, "last_success_at": nil}, r.body)
	})

	db := ledgertest.Open(t, ledgertest.WithNow(time.Now))

	path := db.Path()
	rd, err := sqlite.OpenReader(ctx, path, sqlite.Options{})
	require.NoError(t, err)
	defer rd.Close()
	serve := func(v api.VerificationStatus) *httptest.Server {
		s := api.NewServer(db.Ledger, api.Config{Logger: quiet, Verification: v})
		return MustServe(t, s)
	}
	p := &verify.Periodic{Src: rd, Every: 10 * time.Minute, Logger: quiet}
	srv := serve(p)

	t.Run("OKPending", func(t *testing.T) {
		r := do(t, srv, "GET", "/v1/verification", "")
		require.Equal(t, 200, r.status, r.raw)
		assert.Equal(t, map[string]any{"enabled": true, "every_ms": 600000.0, "ran": false, "last_success_at": nil}, r.body)
	})

	fillAudit(t, func(p, body string) response { return do(t, srv, "POST", p, body) })

	t.Run("OK", func(t *testing.T) {
		start := time.Now().UnixMilli()
		require.NotNil(t, p.Once(ctx))
		r := do(t, srv, "GET", "/v1/verification", "")
		require.Equal(t, 200, r.status, r.raw)
		b := r.body
		assert.Equal(t, true, b["ran"])
		assert.Equal(t, true, b["ok"])
		assert.Nil(t, b["error"])
		assert.Equal(t, false, b["incremental"])
		assert.Equal(t, 11.0, b["receipts"])
		assert.Equal(t, 11.0, b["checked"])
		assert.Equal(t, map[string]any{"seq": 11.0, "hash": db.Head().Hash.String()}, b["head"])
		assert.Equal(t, []any{}, b["violations"])
		assert.Equal(t, 0.0, b["violations_total"])
		assert.GreaterOrEqual(t, b["started_at"].(float64), float64(start))
		assert.GreaterOrEqual(t, b["finished_at"].(float64), b["started_at"].(float64))
		assert.Equal(t, b["finished_at"], b["last_success_at"])
	})

	t.Run("ErrViolations", func(t *testing.T) {
		tamperFile(t, path, 2)
		q := &verify.Periodic{Src: rd, Every: time.Minute, Logger: quiet}
		require.NotNil(t, q.Once(ctx))
		r := do(t, serve(q), "GET", "/v1/verification", "")
		require.Equal(t, 200, r.status, r.raw)
		b := r.body
		assert.Equal(t, false, b["ok"])
		assert.Nil(t, b["last_success_at"])
		assert.Equal(t, 1.0, b["violations_total"])
		require.Len(t, b["violations"], 1)
		v := b["violations"].([]any)[0].(map[string]any)
		assert.Equal(t, 2.0, v["seq"])
		assert.Equal(t, verify.RuleHashMismatch, v["rule"])
		assert.NotEmpty(t, v["detail"])
	})

	t.Run("ErrUnreadable", func(t *testing.T) {
		bad, err := sqlite.OpenReader(ctx, path, sqlite.Options{})
		require.NoError(t, err)
		require.NoError(t, bad.Close())
		q := &verify.Periodic{Src: bad, Every: time.Minute, Logger: quiet}
		assert.Nil(t, q.Once(ctx))
		r := do(t, serve(q), "GET", "/v1/verification", "")
		require.Equal(t, 200, r.status, r.raw)
		assert.Equal(t, true, r.body["ran"])
		assert.Equal(t, false, r.body["ok"])
		assert.Contains(t, r.body["error"], "could not read the ledger")
		assert.NotContains(t, r.raw, path, "no internals")
	})
}
