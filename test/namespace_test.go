package test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// nsReserve is a reserve body for key with tool.
func nsReserve(key, exec, tool string) string {
	return `{"idempotency_key":"` + key + `","execution_id":"` + exec + `","tool":"` + tool + `","effect":"write","idempotent":true}`
}

// TestNamespaces drives namespaces end to end on SQLite through the real
// binaries: created through the API and through ledgerctl beside the
// running ledgerd, independent chains, the ledgerctl read commands and
// verify per namespace, metrics, checkpoints and portable receipts per
// namespace, a restart, a backup, and tokens limited to a namespace.
func TestNamespaces(t *testing.T) {
	t.Parallel()
	outer := t // the restarted ledgerd outlives its subtest
	dir := t.TempDir()
	clock := newWallClock(t)
	l, vkey, key := startSignedEnv(t, dir, []string{clock.env()})
	db := l.DB

	// Created through the API and through ledgerctl while ledgerd runs.
	r := l.Do("POST", "/v1/namespaces", `{"name":"a"}`)
	require.Equal(t, 201, r.Status, r.Raw)
	out, stderr, code := ledgerctl(t, "namespace", "create", "--db", db, "b")
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, "namespace b created ("+db+")\n", out)
	assert.NoDirExists(t, db+".ns", "every namespace lives in the ledger file")
	r = l.Do("GET", "/v1/ns/b/head", "")
	require.Equal(t, 200, r.Status, "the running ledgerd serves a namespace ledgerctl created: %s", r.Raw)
	assert.Equal(t, float64(0), r.Body["seq"])
	out, stderr, code = ledgerctl(t, "namespace", "create", "--server", l.URL, "c", "--json")
	require.Equal(t, 0, code, stderr)
	assert.JSONEq(t, `{"name":"c","head":{"seq":0,"hash":"`+strings.Repeat("0", 64)+`"},"key_ttl_ms":0,"payloads":"committed"}`, out)

	t.Run("ErrCreate", func(t *testing.T) {
		for _, tc := range []struct {
			desc    string
			args    []string
			wantErr string
		}{
			{desc: "exists on file", args: []string{"--db", db, "b"}, wantErr: `namespace "b" exists`},
			{desc: "default exists", args: []string{"--db", db, "default"}, wantErr: `namespace "default" exists`},
			{desc: "exists on server", args: []string{"--server", l.URL, "a"}, wantErr: "namespace_exists"},
			{desc: "bad name", args: []string{"--db", db, "A!"}, wantErr: "names are 1–64 bytes"},
			{desc: "too long", args: []string{"--server", l.URL, strings.Repeat("a", 65)}, wantErr: "names are 1–64 bytes"},
			{desc: "empty", args: []string{"--db", db, ""}, wantErr: "names are 1–64 bytes"},
			{desc: "no name", args: []string{"--db", db}, wantErr: "want exactly one NAME"},
		} {
			t.Run(tc.desc, func(t *testing.T) {
				out, stderr, code := ledgerctl(t, append([]string{"namespace", "create"}, tc.args...)...)
				assert.Equal(t, 2, code, out)
				assert.Contains(t, stderr, tc.wantErr)
			})
		}
		for _, body := range []string{`{"name":"A!"}`, `{"name":""}`, `{"name":"` + strings.Repeat("x", 65) + `"}`} {
			r := l.Do("POST", "/v1/namespaces", body)
			assert.Equal(t, 400, r.Status, body)
			assert.Equal(t, "invalid_request", r.Code(), body)
		}
		r := l.Do("POST", "/v1/namespaces", `{"name":"a"}`)
		assert.Equal(t, 409, r.Status)
		assert.Equal(t, "namespace_exists", r.Code())
		for _, path := range []string{"/v1/ns/nope/head", "/v1/ns/nope/effects/shared-key-0001", "/log/nope/checkpoint"} {
			r := l.Do("GET", path, "")
			assert.Equal(t, 404, r.Status, path)
			assert.Equal(t, "unknown_namespace", r.Code(), path)
		}
	})

	// One key in three namespaces is three effects, each chain from seq 1.
	for _, ns := range []string{"default", "a", "b"} {
		prefix := "/v1/ns/" + ns
		r := l.Do("POST", prefix+"/effects/reserve", nsReserve("shared-key-0001", "exec-"+ns, "tool."+ns))
		require.Equal(t, 201, r.Status, r.Raw)
		assert.Equal(t, map[string]any{"seq": float64(1), "hash": r.Body["receipt"].(map[string]any)["hash"]}, r.Body["receipt"], ns)
		if ns != "b" {
			c := l.Do("POST", prefix+"/effects/shared-key-0001/commit", `{"reservation":"`+r.Body["reservation"].(string)+`","outcome":"succeeded","external_ref":"ref-`+ns+`"}`)
			require.Equal(t, 201, c.Status, c.Raw)
			assert.Equal(t, float64(2), c.Body["receipt"].(map[string]any)["seq"])
		}
	}
	r = l.Do("GET", "/v1/effects/shared-key-0001", "")
	assert.Equal(t, "succeeded", r.Body["state"])
	assert.Equal(t, "tool.default", r.Body["tool"])
	r = l.Do("GET", "/v1/ns/b/effects/shared-key-0001", "")
	assert.Equal(t, "reserved", r.Body["state"], "b's key is its own")
	assert.Equal(t, "tool.b", r.Body["tool"])
	r = l.Do("GET", "/v1/ns/c/effects/shared-key-0001", "")
	assert.Equal(t, "unknown_key", r.Code())
	appendNS(t, l, "/v1/ns/a", "bulk-a", 5) // a: 7 receipts

	t.Run("ledgerctl", func(t *testing.T) {
		for _, src := range [][]string{{"--db", db}, {"--server", l.URL}} {
			out, stderr, code := ledgerctl(t, append([]string{"head", "--namespace", "a", "--json"}, src...)...)
			require.Equal(t, 0, code, stderr)
			head := l.Do("GET", "/v1/ns/a/head", "")
			assert.JSONEq(t, head.Raw, out, "%v", src)

			out, stderr, code = ledgerctl(t, append([]string{"show", "shared-key-0001", "--namespace", "b", "--json"}, src...)...)
			require.Equal(t, 0, code, stderr)
			assert.Contains(t, out, `"state":"reserved"`)
			assert.Contains(t, out, `"tool":"tool.b"`)

			out, stderr, code = ledgerctl(t, append([]string{"export", "--namespace", "a"}, src...)...)
			require.Equal(t, 0, code, stderr)
			assert.Equal(t, 7, strings.Count(out, "\n"), "%v", src)

			out, stderr, code = ledgerctl(t, append([]string{"receipts", "--namespace", "b", "--json"}, src...)...)
			require.Equal(t, 0, code, stderr)
			assert.Equal(t, 1, strings.Count(out, `"seq":`), out)

			out, stderr, code = ledgerctl(t, append([]string{"verify", "--namespace", "a", "--json"}, src...)...)
			require.Equal(t, 0, code, stderr)
			var rep struct {
				OK       bool `json:"ok"`
				Receipts int  `json:"receipts"`
			}
			require.NoError(t, json.Unmarshal([]byte(out), &rep))
			assert.True(t, rep.OK)
			assert.Equal(t, 7, rep.Receipts)

			out, stderr, code = ledgerctl(t, append([]string{"audit", "--namespace", "a", "--json"}, src...)...)
			require.Equal(t, 0, code, stderr)
			assert.Contains(t, out, `"interrupted":[]`)

			out, stderr, code = ledgerctl(t, append([]string{"verify", "--namespace", "nope"}, src...)...)
			assert.Equal(t, 2, code, out)
			assert.Contains(t, stderr, "nope")

			out, stderr, code = ledgerctl(t, append([]string{"head", "--namespace", "Bad!"}, src...)...)
			assert.Equal(t, 2, code, out)
			assert.Contains(t, stderr, `--namespace "Bad!"`)

			out, stderr, code = ledgerctl(t, append([]string{"namespace", "list", "--json"}, src...)...)
			require.Equal(t, 0, code, stderr)
			var list struct {
				Namespaces []struct {
					Name string `json:"name"`
					Head struct {
						Seq uint64 `json:"seq"`
					} `json:"head"`
				} `json:"namespaces"`
			}
			require.NoError(t, json.Unmarshal([]byte(out), &list), out)
			got := map[string]uint64{}
			for _, n := range list.Namespaces {
				got[n.Name] = n.Head.Seq
			}
			assert.Equal(t, map[string]uint64{"default": 2, "a": 7, "b": 1, "c": 0}, got, "%v", src)
		}
		out, _, code := ledgerctl(t, "namespace", "list", "--db", db)
		require.Equal(t, 0, code)
		assert.Regexp(t, `(?m)^NAME +SEQ +HASH +KEY_TTL +PAYLOADS$`, out)
		assert.Regexp(t, `(?m)^b +1 +[0-9a-f]{64} +- +committed$`, out)
		assert.Regexp(t, `(?m)^default +2 +[0-9a-f]{64} +- +committed$`, out)

		out, _, code = ledgerctl(t, "verify", "--db", db, "--all-namespaces")
		assert.Equal(t, 0, code, out)
		for _, ns := range []string{"a", "b", "c", "default"} {
			assert.Contains(t, out, "== namespace "+ns+" ==\nOK: ")
		}
		assert.Contains(t, out, "4 namespaces verified, 0 with violations")
		out, stderr, code = ledgerctl(t, "verify", "--server", l.URL, "--all-namespaces", "--json")
		require.Equal(t, 0, code, stderr)
		var all struct {
			OK         bool `json:"ok"`
			Namespaces map[string]struct {
				OK       bool `json:"ok"`
				Receipts int  `json:"receipts"`
			} `json:"namespaces"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &all), out)
		assert.True(t, all.OK)
		assert.Equal(t, 7, all.Namespaces["a"].Receipts)
		assert.Equal(t, 1, all.Namespaces["b"].Receipts)
		assert.Len(t, all.Namespaces, 4)
		out, stderr, code = ledgerctl(t, "verify", "--db", db, "--all-namespaces", "--namespace", "a")
		assert.Equal(t, 2, code, out)
		assert.Contains(t, stderr, "leave out --namespace")
	})

	t.Run("metrics", func(t *testing.T) {
		r := l.Do("GET", "/metrics", "")
		require.Equal(t, 200, r.Status)
		assert.Contains(t, r.Raw, `ledger_chain_head_seq{namespace="a"} 7`)
		assert.Contains(t, r.Raw, `ledger_chain_head_seq{namespace="b"} 1`)
	})

	t.Run("resolve", func(t *testing.T) {
		r := l.Do("POST", "/v1/ns/c/effects/reserve", `{"idempotency_key":"wire-9-abcd","execution_id":"exec-w","tool":"bank.wire","effect":"external","lease_ms":10}`)
		require.Equal(t, 201, r.Status, r.Raw)
		clock.advance(20 * time.Millisecond) // the lease ends: interrupted
		_, stderr, code := ledgerctl(t, "resolve", "wire-9-abcd", "--server", l.URL, "--outcome", "failed", "--error-code", "NOT_SENT", "--note", "no wire at the bank")
		assert.Equal(t, 2, code, "the key is c's, not default's")
		assert.Contains(t, stderr, "unknown_key")
		out, stderr, code := ledgerctl(t, "resolve", "wire-9-abcd", "--server", l.URL, "--namespace", "c", "--outcome", "failed", "--error-code", "NOT_SENT", "--note", "no wire at the bank")
		require.Equal(t, 0, code, stderr)
		assert.Contains(t, out, "resolved wire-9-abcd: now failed (receipt 2:")
	})

	t.Run("checkpoints", func(t *testing.T) {
		note, c := waitCheckpointNS(t, l, vkey, "a", 7)
		assert.Equal(t, "ex.test/a", c.Origin)
		out, stderr, code := ledgerctl(t, "checkpoint", "--server", l.URL, "--namespace", "a", "--json")
		require.Equal(t, 0, code, stderr)
		assert.Contains(t, out, `"origin":"ex.test/a"`)
		assert.Contains(t, out, `"tree_size":7`)
		_, bc := waitCheckpointNS(t, l, vkey, "b", 1)
		assert.Equal(t, "ex.test/b", bc.Origin)

		for _, src := range [][]string{{"--server", l.URL}, {"--db", db}} {
			out, stderr, code = ledgerctl(t, append([]string{"prove", "shared-key-0001", "--namespace", "a"}, src...)...)
			require.Equal(t, 0, code, stderr)
			file := filepath.Join(dir, "proof-a.jsonl")
			require.NoError(t, os.WriteFile(file, []byte(out), 0o600))
			out, _, code = ledgerctl(t, "check-proof", file, "--vkey", vkey)
			assert.Equal(t, 1, code, "a's receipts are not default's: %s", out)
			out, stderr, code = ledgerctl(t, "check-proof", file, "--vkey", vkey, "--namespace", "a")
			assert.Equal(t, 0, code, stderr)
			assert.Equal(t, 2, strings.Count(out, "valid: receipt"), out)
			assert.Contains(t, out, "(key shared-key-0001) is in ex.test/a at tree size 7")
		}
		r := l.Do("GET", "/v1/ns/a/receipts/1/proof", "")
		require.Equal(t, 200, r.Status, r.Raw)
		assert.Equal(t, note, r.Body["checkpoint"])
		assert.Equal(t, "tool.a", r.Body["receipt"].(map[string]any)["tool"])

		// The checkpoint of a verifies a's chain, and only a's.
		cp := filepath.Join(dir, "checkpoint-a.txt")
		require.NoError(t, os.WriteFile(cp, []byte(note), 0o600))
		out, stderr, code = ledgerctl(t, "verify", "--db", db, "--namespace", "a", "--checkpoint", cp, "--vkey", vkey)
		assert.Equal(t, 0, code, out+stderr)
		out, stderr, code = ledgerctl(t, "verify", "--db", db, "--checkpoint", cp, "--vkey", vkey)
		assert.Equal(t, 2, code, "a's checkpoint is refused for default's chain: %s", out)
		assert.Contains(t, stderr, `"ex.test/a", want "ex.test/default"`)
	})

	t.Run("backup", func(t *testing.T) {
		copyDB := filepath.Join(t.TempDir(), "copy.db")
		out, stderr, code := ledgerctl(t, "backup", "--db", db, "--out", copyDB)
		require.Equal(t, 0, code, stderr)
		assert.Regexp(t, `namespace a: in the copy \(7 receipts\); verified: OK, head 7:[0-9a-f]{64}`, out)
		assert.NoDirExists(t, copyDB+".ns", "the copy of the ledger file holds every namespace")
		out, stderr, code = ledgerctl(t, "verify", "--db", copyDB, "--all-namespaces", "--json")
		assert.Equal(t, 0, code, stderr)
		assert.Contains(t, out, `"ok":true`)
		out, stderr, code = ledgerctl(t, "head", "--db", copyDB, "--namespace", "a")
		require.Equal(t, 0, code, stderr)
		assert.True(t, strings.HasPrefix(out, "7:"), out)
		_, stderr, code = ledgerctl(t, "backup", "--db", db, "--out", copyDB)
		assert.Equal(t, 2, code)
		assert.Contains(t, stderr, "give --force")
	})

	t.Run("restart", func(t *testing.T) {
		require.NoError(t, l.Stop())
		l = StartLedgerd(outer, db, "--signing-key", key, "--log-origin", "ex.test", "--checkpoint-interval", "20ms")
		r := l.Do("GET", "/v1/namespaces", "")
		require.Equal(t, 200, r.Status, r.Raw)
		var names []string
		for _, v := range r.Body["namespaces"].([]any) {
			names = append(names, v.(map[string]any)["name"].(string))
		}
		assert.Equal(t, []string{"a", "b", "c", "default"}, names)
		r = l.Do("POST", "/v1/ns/b/effects/reserve", nsReserve("after-restart-1", "exec-r", "tool.b"))
		require.Equal(t, 201, r.Status, r.Raw)
		assert.Equal(t, float64(2), r.Body["receipt"].(map[string]any)["seq"], "b's chain goes on")
	})

	t.Run("tokens", func(t *testing.T) {
		out, stderr, code := ledgerctl(t, "token", "create", "--db", db, "--role", "writer", "--name", "only-a", "--namespace", "a", "--json")
		require.Equal(t, 0, code, stderr)
		var created struct {
			Namespaces []string `json:"namespaces"`
			Token      string   `json:"token"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &created))
		assert.Equal(t, []string{"a"}, created.Namespaces)
		onlyA := "Bearer " + created.Token
		out, stderr, code = ledgerctl(t, "token", "create", "--db", db, "--role", "admin", "--name", "ops")
		require.Equal(t, 0, code, stderr)
		admin := strings.TrimSpace(out)
		_, stderr, code = ledgerctl(t, "token", "create", "--db", db, "--role", "reader", "--name", "typo", "--namespace", "a,zz")
		require.Equal(t, 0, code, stderr)
		assert.Contains(t, stderr, `namespace "zz" does not exist yet`)
		for _, bad := range []string{"A!", "a,,b", ","} {
			_, stderr, code = ledgerctl(t, "token", "create", "--db", db, "--role", "reader", "--name", "bad", "--namespace", bad)
			assert.Equal(t, 2, code, bad)
			assert.Contains(t, stderr, "is not a namespace name", bad)
		}
		out, _, code = ledgerctl(t, "token", "list", "--db", db)
		require.Equal(t, 0, code)
		assert.Regexp(t, `(?m)^only-a +writer +a +`, out)
		assert.Regexp(t, `(?m)^ops +admin +\* +`, out)
		assert.Regexp(t, `(?m)^typo +reader +a,zz +`, out)
		out, _, code = ledgerctl(t, "token", "list", "--db", db, "--json")
		require.Equal(t, 0, code)
		assert.Contains(t, out, `"name":"only-a","role":"writer"`)
		assert.Contains(t, out, `"namespaces":["a"]`)

		require.Eventually(t, func() bool { return l.Do("GET", "/v1/head", "").Status == 401 }, 60*time.Second, 50*time.Millisecond)
		r := l.Do("POST", "/v1/ns/a/effects/reserve", nsReserve("scoped-key-0001", "exec-s", "tool.a"), "Authorization", onlyA)
		assert.Equal(t, 201, r.Status, r.Raw)
		for _, path := range []string{"/v1/head", "/v1/ns/b/head", "/v1/ns/nope/head", "/v1/ns/b/effects/shared-key-0001", "/v1/ns/b/effects/no-such-key-1"} {
			r := l.Do("GET", path, "", "Authorization", onlyA)
			assert.Equal(t, 403, r.Status, path)
			assert.Equal(t, "forbidden", r.Code(), path)
		}
		r = l.Do("GET", "/v1/namespaces", "", "Authorization", "Bearer "+admin)
		assert.Len(t, r.Body["namespaces"], 4)
		out, stderr, code = ledgerctl(t, "namespace", "list", "--server", l.URL, "--token", created.Token, "--json")
		// A writer may not list namespaces (a reader route).
		assert.Equal(t, 2, code, out)
		assert.Contains(t, stderr, "forbidden")
		_, stderr, code = ledgerctl(t, "head", "--server", l.URL, "--token", created.Token, "--namespace", "b")
		assert.Equal(t, 2, code)
		assert.Contains(t, stderr, "forbidden")
		out, stderr, code = ledgerctl(t, "head", "--server", l.URL, "--token", created.Token, "--namespace", "a")
		assert.Equal(t, 0, code, stderr)
		assert.True(t, strings.HasPrefix(out, "8:"), out)
		_, stderr, code = ledgerctl(t, "namespace", "create", "--server", l.URL, "--token", admin, "d")
		assert.Equal(t, 0, code, stderr)
	})

	t.Run("tampered", func(t *testing.T) {
		editLedger(t, db, `DROP TRIGGER ns_receipts_no_update`,
			`UPDATE ns_receipts SET external_ref = 'forged' WHERE ns = (SELECT id FROM namespaces WHERE name = 'b') AND seq = 1`)
		out, _, code := ledgerctl(t, "verify", "--db", db, "--all-namespaces")
		assert.Equal(t, 1, code, out)
		assert.Contains(t, out, "== namespace a ==\nOK: ")
		assert.Contains(t, out, "== namespace b ==\nFAILED: ")
		assert.Contains(t, out, "hash_mismatch")
		assert.Contains(t, out, "5 namespaces verified, 1 with violations")
		out, _, code = ledgerctl(t, "verify", "--db", db, "--all-namespaces", "--json")
		assert.Equal(t, 1, code)
		var all struct {
			OK         bool `json:"ok"`
			Namespaces map[string]struct {
				OK bool `json:"ok"`
			} `json:"namespaces"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &all), out)
		assert.False(t, all.OK)
		assert.True(t, all.Namespaces["a"].OK)
		assert.False(t, all.Namespaces["b"].OK)
		out, _, code = ledgerctl(t, "verify", "--db", db, "--namespace", "a")
		assert.Equal(t, 0, code, "a is intact: %s", out)
	})
}

// TestLedgerctl_postgresURL checks what ledgerctl does with a PostgreSQL
// URL it cannot use: SQLite-only commands refuse it, and no message shows
// the URL's password.
func TestLedgerctl_postgresURL(t *testing.T) {
	t.Parallel()
	dsn := "postgres://auditor:s3cr3t-pw@" + strings.TrimPrefix(closedAddr(t), "http://") + "/ledger?sslmode=disable"
	for _, tc := range []struct {
		desc    string
		args    []string
		wantErr string
	}{
		{desc: "backup", args: []string{"backup", "--db", dsn, "--out", filepath.Join(t.TempDir(), "x.db")}, wantErr: "pg_dump"},
		{desc: "rebuild-keys", args: []string{"rebuild-keys", "--db", dsn}, wantErr: "SQLite ledger files only"},
		{desc: "verify", args: []string{"verify", "--db", dsn}, wantErr: "postgres://auditor:xxxxx@"},
		{desc: "verify all", args: []string{"verify", "--db", dsn, "--all-namespaces"}, wantErr: "postgres://auditor:xxxxx@"},
		{desc: "head", args: []string{"head", "--db", dsn, "--namespace", "a"}, wantErr: "postgres://auditor:xxxxx@"},
		{desc: "namespace create", args: []string{"namespace", "create", "--db", dsn, "a"}, wantErr: "postgres://auditor:xxxxx@"},
		{desc: "namespace list", args: []string{"namespace", "list", "--db", dsn}, wantErr: "postgres://auditor:xxxxx@"},
		{desc: "token create", args: []string{"token", "create", "--db", dsn, "--role", "reader", "--name", "x"}, wantErr: "postgres://auditor:xxxxx@"},
		{desc: "token list", args: []string{"token", "list", "--db", dsn}, wantErr: "postgres://auditor:xxxxx@"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			out, stderr, code := ledgerctl(t, tc.args...)
			assert.Equal(t, 2, code, out)
			assert.Contains(t, stderr, tc.wantErr)
			assert.NotContains(t, stderr+out, "s3cr3t-pw")
			assert.NotContains(t, stderr, "no ledger database at", "a URL is not a file")
		})
	}
}
