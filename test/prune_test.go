package test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPrune_endToEnd drives SPEC §16's archive-then-prune through the real
// binaries on SQLite and PostgreSQL: a namespace with a key TTL and an
// archive policy, a few hundred reserve+commit pairs, an ask, one key in
// flight; the clock moved past the TTL and keep_ms; POST …/prune {} →
// 201 up to the key in flight. After it: a pruned receipt, a key pruned
// whole, an ask and a portable receipt are 410 pruned (with the prune
// and segment); a reserve of the pruned key is a new key (ref_seq 0); a
// live key replays; inclusion and consistency proofs, every full hash
// tile and entry bundle answer byte for byte as before; the segment passes
// ledgerctl verify --segment --vkey; GET /v1/head and GET …/prune say
// what was pruned; the refusals (no TTL, no archive policy, a through
// above the watermark, a writer token) and a second POST (200
// already_pruned) append nothing; a restarted ledgerd still answers 410
// and prunes nothing by itself; ledgerctl prune --db then prunes the
// rest in process, once the key in flight has finished.
func TestPrune_endToEnd(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, testPruneEndToEnd)
}

// prunePairs is how many reserve+commit pairs the prune tests append.
const prunePairs = 300

func testPruneEndToEnd(t *testing.T, db string) {
	clock := newTestClock(t, t0)
	keyDir, archiveDir := t.TempDir(), t.TempDir()
	key, vkey := keygen(t, keyDir, "ex.test")
	args := []string{"--signing-key", key, "--log-origin", "ex.test", "--checkpoint-interval", "20ms", "--public-log",
		"--archive-dir", archiveDir, "--prune-interval", "0", "--metrics-auth=false"}
	l := clock.start(t, db, args...)

	// Open (no tokens yet): the namespaces, the policy and the receipts.
	for _, body := range []string{`{"name":"aged","key_ttl_ms":60000}`, `{"name":"nottl"}`, `{"name":"nopol","key_ttl_ms":60000}`} {
		r := l.Do("POST", "/v1/namespaces", body)
		require.Equal(t, 201, r.Status, r.Raw)
	}
	const policy = `{"rules":[{"tool":"gate.pay","approval":"required","expires_in_ms":60000}],"self_approval":"allow",` +
		`"archive":{"keep_ms":60000,"min_keep_ms":60000}}`
	require.Equal(t, 200, l.Do("PUT", "/v1/namespaces/aged/policy", policy).Status)
	require.Equal(t, 200, l.Do("PUT", "/v1/namespaces/nottl/policy", `{"archive":{"keep_ms":60000,"min_keep_ms":60000}}`).Status)
	appendPairs(t, l, "/v1/ns/aged", "done", prunePairs)
	for _, ns := range []string{"nottl", "nopol"} {
		appendPairs(t, l, "/v1/ns/"+ns, "done", 2)
	}
	gate := `{"idempotency_key":"gate-0000001","execution_id":"e1","tool":"gate.pay","effect":"external","input":{"n":1}}`
	r := l.Do("POST", "/v1/ns/aged/effects/reserve", gate)
	require.Equal(t, 202, r.Status, r.Raw)
	askSeq := num(t, r.Body, "approval", "seq")
	require.Equal(t, 201, l.Do("POST", fmt.Sprintf("/v1/ns/aged/approvals/%d", askSeq), `{"decision":"approve"}`).Status)
	r = l.Do("POST", "/v1/ns/aged/effects/reserve", gate)
	require.Equal(t, 201, r.Status, r.Raw)
	require.Equal(t, 201, l.Do("POST", "/v1/ns/aged/effects/gate-0000001/commit", `{"reservation":"`+r.Body["reservation"].(string)+`","outcome":"succeeded"}`).Status)
	// A key in flight pins the watermark below its reserve.
	r = l.Do("POST", "/v1/ns/aged/effects/reserve", `{"idempotency_key":"open-0000001","execution_id":"e1","tool":"mail.send","effect":"external","lease_ms":3600000}`)
	require.Equal(t, 201, r.Status, r.Raw)
	openTok, openSeq := r.Body["reservation"].(string), num(t, r.Body, "receipt", "seq")
	appendPairs(t, l, "/v1/ns/aged", "after", 10)
	// A checkpoint above what will be pruned (those below it are thinned
	// by the prune), for a consistency proof through pruned subtrees.
	_, cp1 := waitCheckpointNS(t, l, vkey, "aged", openSeq+20)
	require.NoError(t, l.Stop())

	admin := createToken(t, db, "ops", "admin")
	writer := createToken(t, db, "agent", "writer")
	l = clock.start(t, db, args...)
	do := func(method, path, body string) Resp {
		t.Helper()
		return l.Do(method, path, body, "Authorization", "Bearer "+admin)
	}
	clock.advance(3 * time.Minute) // past the key TTL and keep_ms
	// A key finished now: too young to prune, its replay stays live.
	late := `{"idempotency_key":"late-0000001","execution_id":"e1","tool":"mail.send","effect":"write"}`
	r = do("POST", "/v1/ns/aged/effects/reserve", late)
	require.Equal(t, 201, r.Status, r.Raw)
	require.Equal(t, 201, do("POST", "/v1/ns/aged/effects/late-0000001/commit", `{"reservation":"`+r.Body["reservation"].(string)+`","outcome":"succeeded"}`).Status)
	head := num(t, do("GET", "/v1/ns/aged/head", "").Body, "seq")
	_, cp := waitCheckpointNS(t, l, vkey, "aged", head)
	size := cp.Size

	// What must not change: proofs, full tiles and entry bundles.
	W := openSeq - 1
	var paths []string
	for _, seq := range []int64{1, 2, 100, W / 2, W, W + 1, size} {
		paths = append(paths, fmt.Sprintf("/v1/ns/aged/proof/inclusion?seq=%d&size=%d", seq, size))
	}
	for _, from := range []int64{0, cp1.Size} {
		paths = append(paths, fmt.Sprintf("/v1/ns/aged/proof/consistency?from=%d&to=%d", from, size))
	}
	for i := range size / 256 {
		paths = append(paths, fmt.Sprintf("/log/aged/tile/0/%03d", i), fmt.Sprintf("/log/aged/tile/entries/%03d", i))
	}
	before := map[string]string{}
	for _, p := range paths {
		r := do("GET", p, "")
		require.Equal(t, 200, r.Status, "%s: %s", p, r.Raw)
		before[p] = r.Raw
	}
	hashW := do("GET", fmt.Sprintf("/v1/ns/aged/receipts/%d", W), "").Body["hash"]

	// The refusals: nothing appended by any.
	refused := func(ns, body, reason string) Resp {
		t.Helper()
		r := do("POST", "/v1/ns/"+ns+"/prune", body)
		require.Equal(t, 409, r.Status, r.Raw)
		assert.Equal(t, "not_prunable", r.Code(), r.Raw)
		assert.Equal(t, reason, r.Body["error"].(map[string]any)["details"].(map[string]any)["reason"], r.Raw)
		return r
	}
	refused("nottl", `{}`, "no_key_ttl")
	refused("nopol", `{}`, "no_archive_policy")
	r = refused("aged", fmt.Sprintf(`{"through":%d}`, openSeq+1), "pinned")
	pin := r.Body["error"].(map[string]any)["details"].(map[string]any)["pinned_by"].(map[string]any)
	assert.Equal(t, "open-0000001", pin["key"], r.Raw)
	assert.Equal(t, float64(openSeq), pin["seq"], r.Raw)
	r = l.Do("POST", "/v1/ns/aged/prune", `{}`, "Authorization", "Bearer "+writer)
	assert.Equal(t, 403, r.Status, r.Raw)
	for _, bad := range []string{`{"through":-1}`, `{"through":1.5}`, `{"through":"5"}`, `{"through":0}`, `{"x":1}`, `[]`} {
		r = do("POST", "/v1/ns/aged/prune", bad)
		assert.Equal(t, 400, r.Status, "%s: %s", bad, r.Raw)
	}
	assert.Equal(t, float64(head), do("GET", "/v1/ns/aged/head", "").Body["seq"], "the refusals appended nothing")
	out, stderr, code := ledgerctl(t, "prune", "--server", l.URL, "--token", admin, "--namespace", "aged", "--auto", "--dry-run")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, fmt.Sprintf("prunable through %d", W))
	assert.Contains(t, out, "held back by key open-0000001: reserved")

	// The prune.
	r = do("POST", "/v1/ns/aged/prune", `{}`)
	require.Equal(t, 201, r.Status, "%s\n%s", r.Raw, l.Logs())
	r0 := r
	assert.Equal(t, "pruned", r.Body["status"])
	assert.Equal(t, 1.0, r.Body["from"])
	assert.Equal(t, float64(W), r.Body["through"])
	assert.Equal(t, true, r.Body["deleting"])
	segment := r.Body["segment"].(string)
	assert.Equal(t, fmt.Sprintf("aged-1-%d", W), segment)
	pruneSeq := num(t, r.Body, "receipt", "seq")
	assert.Equal(t, head+1, pruneSeq)
	assert.GreaterOrEqual(t, l.metric("ledger_prunes_total"), 1.0)

	r = do("POST", "/v1/ns/aged/prune", fmt.Sprintf(`{"through":%d}`, W))
	require.Equal(t, 200, r.Status, r.Raw)
	assert.Equal(t, "already_pruned", r.Body["status"])
	assert.Equal(t, float64(pruneSeq), r.Body["receipt"].(map[string]any)["seq"])
	r = do("POST", "/v1/ns/aged/prune", `{}`)
	require.Equal(t, 200, r.Status, r.Raw)
	assert.Equal(t, "nothing_to_prune", r.Body["status"], "the key in flight still pins")
	out, stderr, code = ledgerctl(t, "prune", "--server", l.URL, "--token", admin, "--namespace", "aged", "--through", fmt.Sprint(W-1))
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, fmt.Sprintf("already pruned: receipts 1–%d by prune receipt %d:%s (segment %s)\n", W, pruneSeq,
		r0.Body["receipt"].(map[string]any)["hash"], segment), out)
	out, stderr, code = ledgerctl(t, "prune", "--server", l.URL, "--token", admin, "--namespace", "aged", "--through", fmt.Sprint(openSeq))
	assert.Equal(t, 2, code, out)
	assert.Contains(t, stderr, "prune refused (pinned)")
	assert.Contains(t, stderr, "pinned by key open-0000001 (reserved, from seq "+fmt.Sprint(openSeq)+")")
	out, stderr, code = ledgerctl(t, "prune", "--server", l.URL, "--token", writer, "--namespace", "aged", "--auto")
	assert.Equal(t, 2, code, out)
	assert.Contains(t, stderr, "forbidden")

	// deleted: the deletion has finished. Before, a GET of a key pruned
	// whole is not checked: on SQLite it can be 404 unknown_key while the
	// deletion batch holding the key runs (the key index forgets the key's
	// record before the batch's transaction records the key as pruned).
	checkPruned := func(t *testing.T, deleted bool) {
		t.Helper()
		gone := func(path string, wantSeq int64) {
			t.Helper()
			r := do("GET", path, "")
			require.Equal(t, 410, r.Status, "%s: %s", path, r.Raw)
			assert.Equal(t, "pruned", r.Code(), r.Raw)
			d := r.Body["error"].(map[string]any)["details"].(map[string]any)
			assert.Equal(t, float64(W), d["pruned_through"], r.Raw)
			assert.Equal(t, float64(pruneSeq), d["prune"], r.Raw)
			assert.Equal(t, segment, d["segment"], r.Raw)
			if wantSeq > 0 {
				assert.Equal(t, float64(wantSeq), d["seq"], r.Raw)
			}
		}
		gone("/v1/ns/aged/receipts/5", 5)
		gone(fmt.Sprintf("/v1/ns/aged/receipts/%d", W), W)
		gone("/v1/ns/aged/receipts/5/proof", 5)
		if deleted {
			gone("/v1/ns/aged/effects/done-0007", 0)
		}
		gone(fmt.Sprintf("/v1/ns/aged/approvals/%d", askSeq), askSeq)
		r := do("GET", fmt.Sprintf("/v1/ns/aged/receipts/%d", W+1), "")
		assert.Equal(t, 200, r.Status, "the first live receipt: %s", r.Raw)
		assert.Equal(t, 200, do("GET", "/v1/ns/aged/effects/open-0000001", "").Status)
		h := do("GET", "/v1/ns/aged/head", "")
		require.Equal(t, 200, h.Status, h.Raw)
		assert.Equal(t, map[string]any{"through": float64(W), "hash": hashW, "prune": float64(pruneSeq)}, h.Body["pruned"], h.Raw)
		assert.Nil(t, do("GET", "/v1/ns/nopol/head", "").Body["pruned"], "nothing pruned there")
	}
	checkPruned(t, false)

	// The deletion finishes in the background.
	var st Resp
	require.Eventually(t, func() bool {
		st = do("GET", "/v1/ns/aged/prune", "")
		ps, _ := st.Body["prunes"].([]any)
		return st.Status == 200 && len(ps) == 1 && ps[0].(map[string]any)["deleting"] == false
	}, 60*time.Second, 20*time.Millisecond, "the bodies are deleted: %s", st.Raw)
	assert.Equal(t, float64(W), st.Body["pruned_through"], st.Raw)
	assert.Equal(t, float64(W), st.Body["kept_through"], st.Raw)
	p := st.Body["prunes"].([]any)[0].(map[string]any)
	assert.Equal(t, map[string]any{"seq": float64(pruneSeq), "from": 1.0, "through": float64(W), "segment": segment,
		"digest": p["digest"], "deleting": false}, p)
	assert.Equal(t, float64(W), st.Body["watermark"].(map[string]any)["through"], "the key in flight still pins: %s", st.Raw)
	checkPruned(t, true)
	for _, p := range paths {
		r := do("GET", p, "")
		require.Equal(t, 200, r.Status, "%s: %s", p, r.Raw)
		assert.Equal(t, before[p], r.Raw, "%s answers as before the prune", p)
	}

	// A key pruned whole is a new key; a live key replays.
	r = do("POST", "/v1/ns/aged/effects/reserve", `{"idempotency_key":"done-0011","execution_id":"e9","tool":"other.tool","effect":"write"}`)
	require.Equal(t, 201, r.Status, r.Raw)
	rc := do("GET", fmt.Sprintf("/v1/ns/aged/receipts/%d", num(t, r.Body, "receipt", "seq")), "")
	require.Equal(t, 200, rc.Status, rc.Raw)
	assert.Equal(t, 0.0, rc.Body["ref_seq"], "a new key: %s", rc.Raw)
	require.Equal(t, 201, do("POST", "/v1/ns/aged/effects/done-0011/commit", `{"reservation":"`+r.Body["reservation"].(string)+`","outcome":"succeeded"}`).Status)
	r = do("POST", "/v1/ns/aged/effects/reserve", late)
	require.Equal(t, 200, r.Status, r.Raw)
	assert.Equal(t, "replayed", r.Body["status"])

	// The segment.
	out, stderr, code = ledgerctl(t, "verify", "--segment", filepath.Join(archiveDir, segment), "--vkey", vkey)
	assert.Equal(t, 0, code, "%s%s", out, stderr)

	// A restart: still 410, and nothing pruned or deleted by itself.
	require.Equal(t, 201, do("POST", "/v1/ns/aged/effects/open-0000001/commit", `{"reservation":"`+openTok+`","outcome":"succeeded"}`).Status)
	head = num(t, do("GET", "/v1/ns/aged/head", "").Body, "seq")
	waitCheckpointNS(t, l, vkey, "aged", head)
	require.NoError(t, l.Stop())
	l = clock.start(t, db, args...)
	checkPruned(t, true)
	assert.Equal(t, float64(head), do("GET", "/v1/ns/aged/head", "").Body["seq"], "a restart prunes nothing by itself (--prune-interval 0)")
	require.NoError(t, l.Stop())

	// ledgerctl prune --db, on the real clock (days after the test's):
	// every key has finished and aged, so it prunes up to the checkpoint.
	out, stderr, code = ledgerctl(t, "prune", "--db", db, "--namespace", "aged", "--auto", "--dry-run")
	require.Equal(t, 0, code, "%s%s", out, stderr)
	assert.Contains(t, out, "pruned through "+fmt.Sprint(W), out)
	out, stderr, code = ledgerctl(t, "prune", "--db", db, "--archive-dir", archiveDir, "--namespace", "aged", "--auto")
	require.Equal(t, 0, code, "%s%s", out, stderr)
	assert.Contains(t, out, fmt.Sprintf("pruned receipts %d–", W+1))
	entries, err := os.ReadDir(archiveDir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	require.Len(t, names, 2, "two segments: %v", names)
	second := names[0]
	if second == segment {
		second = names[1]
	}
	assert.True(t, strings.HasPrefix(second, fmt.Sprintf("aged-%d-", W+1)), second)
	out, stderr, code = ledgerctl(t, "verify", "--segment", filepath.Join(archiveDir, second), "--vkey", vkey)
	assert.Equal(t, 0, code, "%s%s", out, stderr)
	// ledgerctl reads a pruned ledger as the API does: a pruned key is
	// gone, proofs over the deleted bodies still verify, and the whole
	// chain verifies from the kept hash, joined to its segments.
	out, stderr, code = ledgerctl(t, "show", "--db", db, "--namespace", "aged", "done-0007")
	assert.NotEqual(t, 0, code, "%s%s", out, stderr)
	assert.Contains(t, out+stderr, "pruned")
	out, stderr, code = ledgerctl(t, "verify", "--db", db, "--namespace", "aged", "--segments", archiveDir)
	assert.Equal(t, 0, code, "%s%s", out, stderr)
	l = clock.start(t, db, args...)
	r = do("GET", "/v1/ns/aged/prune", "")
	require.Equal(t, 200, r.Status, r.Raw)
	require.Len(t, r.Body["prunes"], 2, r.Raw)
	assert.Equal(t, r.Body["pruned_through"], r.Body["kept_through"], "ledgerctl waited for the deletion: %s", r.Raw)
	r = do("GET", fmt.Sprintf("/v1/ns/aged/receipts/%d", W+1), "")
	assert.Equal(t, 410, r.Status, r.Raw)
}

// appendPairs reserves and commits n keys prefix-NNNN through the routes
// under v1, from several clients at once.
func appendPairs(t *testing.T, l *Ledgerd, v1, prefix string, n int) {
	t.Helper()
	const clients = 6
	errs := make(chan error, clients)
	for c := range clients {
		go func() {
			for i := c; i < n; i += clients {
				key := fmt.Sprintf("%s-%04d", prefix, i)
				st, b, err := rawPost(l.URL+v1+"/effects/reserve", `{"idempotency_key":"`+key+`","execution_id":"e1","tool":"mail.send","effect":"write"}`)
				if err == nil && st == 201 {
					st, b, err = rawPost(l.URL+v1+"/effects/"+key+"/commit", `{"reservation":"`+field(b, "reservation")+`","outcome":"succeeded"}`)
				}
				if err == nil && st != 201 {
					err = fmt.Errorf("%s: %d %s", key, st, b)
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range clients {
		require.NoError(t, <-errs)
	}
}

// TestPrune_scheduled: with --archive-dir and the test build's short
// prune interval (LEDGERD_TEST_PRUNE_EVERY), ledgerd prunes by itself,
// as actor "ledgerd", each namespace whose policy has an archive member
// once its keys have aged, and only those: a namespace with a key TTL and
// no archive member is left alone, one with an archive member and no key
// TTL is refused (logged at info) at every interval, and nothing is
// appended there. On SQLite and PostgreSQL.
func TestPrune_scheduled(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, testPruneScheduled)
}

func testPruneScheduled(t *testing.T, db string) {
	clock := newTestClock(t, t0)
	key, vkey := keygen(t, t.TempDir(), "ex.test")
	archiveDir := t.TempDir()
	l := startLedgerdEnv(t, []string{clock.env(), "LEDGERD_TEST_PRUNE_EVERY=50ms"}, db, "--signing-key", key, "--log-origin", "ex.test",
		"--checkpoint-interval", "20ms", "--archive-dir", archiveDir)
	for _, body := range []string{`{"name":"aged","key_ttl_ms":60000}`, `{"name":"nopol","key_ttl_ms":60000}`, `{"name":"nottl"}`} {
		require.Equal(t, 201, l.Do("POST", "/v1/namespaces", body).Status)
	}
	const archive = `{"archive":{"keep_ms":60000,"min_keep_ms":60000}}`
	require.Equal(t, 200, l.Do("PUT", "/v1/namespaces/aged/policy", archive).Status)
	require.Equal(t, 200, l.Do("PUT", "/v1/namespaces/nottl/policy", archive).Status)
	heads := map[string]int64{}
	for _, ns := range []string{"aged", "nopol", "nottl"} {
		appendPairs(t, l, "/v1/ns/"+ns, "sched", 20)
		heads[ns] = num(t, l.Do("GET", "/v1/ns/"+ns+"/head", "").Body, "seq")
		waitCheckpointNS(t, l, vkey, ns, heads[ns])
	}
	clock.advance(3 * time.Minute)
	var r Resp
	require.Eventually(t, func() bool {
		r = l.Do("GET", "/v1/ns/aged/prune", "")
		ps, _ := r.Body["prunes"].([]any)
		return r.Status == 200 && len(ps) == 1
	}, 60*time.Second, 20*time.Millisecond, "a scheduled prune: %s", r.Raw)
	p := r.Body["prunes"].([]any)[0].(map[string]any)
	assert.Equal(t, float64(heads["aged"]), p["through"], "every key aged, the checkpoint covers them: %s", r.Raw)
	rc := l.Do("GET", fmt.Sprintf("/v1/ns/aged/receipts/%d", int64(p["seq"].(float64))), "")
	require.Equal(t, 200, rc.Status, rc.Raw)
	assert.Equal(t, "prune", rc.Body["kind"])
	assert.Equal(t, "ledgerd", rc.Body["actor"])
	_, err := os.Stat(filepath.Join(archiveDir, p["segment"].(string), "manifest.json"))
	assert.NoError(t, err)
	require.Eventually(t, func() bool { return strings.Contains(l.Logs(), `"reason":"no_key_ttl"`) }, 60*time.Second, 20*time.Millisecond,
		"the namespace without a key TTL is refused, at info: %s", l.Logs())
	assert.Contains(t, l.Logs(), `"level":"INFO","msg":"prune: not prunable now; retrying next interval","namespace":"nottl"`)
	time.Sleep(200 * time.Millisecond) // a few more intervals
	for _, ns := range []string{"nopol", "nottl"} {
		assert.Equal(t, float64(heads[ns]), l.Do("GET", "/v1/ns/"+ns+"/head", "").Body["seq"], "nothing appended in %s", ns)
	}
	r = l.Do("GET", "/v1/ns/aged/prune", "")
	assert.Len(t, r.Body["prunes"], 1, "nothing new to prune: %s", r.Raw)
	assert.NotContains(t, l.Logs(), `"namespace":"nopol","reason"`, "no archive member: not even tried")
}

// TestPrune_notCheckpointed: a ledgerd that signs no checkpoints cannot
// prune: a through is 409 not_prunable, reason not_checkpointed; {} finds
// nothing to prune (the latest checkpoint bounds it). Nothing appended.
func TestPrune_notCheckpointed(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, func(t *testing.T, db string) {
		clock := newTestClock(t, t0)
		l := clock.start(t, db, "--archive-dir", t.TempDir(), "--prune-interval", "0")
		require.Equal(t, 201, l.Do("POST", "/v1/namespaces", `{"name":"aged","key_ttl_ms":60000}`).Status)
		require.Equal(t, 200, l.Do("PUT", "/v1/namespaces/aged/policy", `{"archive":{"keep_ms":60000,"min_keep_ms":60000}}`).Status)
		appendPairs(t, l, "/v1/ns/aged", "unsigned", 5)
		clock.advance(3 * time.Minute)
		r := l.Do("POST", "/v1/ns/aged/prune", `{"through":4}`)
		require.Equal(t, 409, r.Status, r.Raw)
		d := r.Body["error"].(map[string]any)["details"].(map[string]any)
		assert.Equal(t, "not_checkpointed", d["reason"], r.Raw)
		r = l.Do("POST", "/v1/ns/aged/prune", `{}`)
		require.Equal(t, 200, r.Status, r.Raw)
		assert.Equal(t, "nothing_to_prune", r.Body["status"], r.Raw)
		assert.Equal(t, 11.0, l.Do("GET", "/v1/ns/aged/head", "").Body["seq"], "the policy and 10 receipts, nothing more")
	})
}

// TestPrune_resumesAtStart: ledgerd killed (kill -9, the test build's
// LEDGERD_TEST_KILL_AT) right after the first deletion batch of a prune
// resumes the deletion at its next start by itself, through the prune's
// range: pruned_through and kept_through meet, the receipts stay 410
// pruned and nothing else is appended. On SQLite and PostgreSQL.
func TestPrune_resumesAtStart(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, func(t *testing.T, db string) {
		clock := newTestClock(t, t0)
		key, vkey := keygen(t, t.TempDir(), "ex.test")
		args := []string{"--signing-key", key, "--log-origin", "ex.test", "--checkpoint-interval", "20ms",
			"--archive-dir", t.TempDir(), "--prune-interval", "0"}
		l := startLedgerdEnv(t, []string{clock.env(), "LEDGERD_TEST_KILL_AT=batch-1"}, db, args...)
		require.Equal(t, 201, l.Do("POST", "/v1/namespaces", `{"name":"aged","key_ttl_ms":60000}`).Status)
		require.Equal(t, 200, l.Do("PUT", "/v1/namespaces/aged/policy", `{"archive":{"keep_ms":60000,"min_keep_ms":60000}}`).Status)
		appendPairs(t, l, "/v1/ns/aged", "resume", prunePairs) // 601 receipts: three deletion batches or more
		clock.advance(3 * time.Minute)
		head := num(t, l.Do("GET", "/v1/ns/aged/head", "").Body, "seq")
		waitCheckpointNS(t, l, vkey, "aged", head)
		r := l.Do("POST", "/v1/ns/aged/prune", `{}`)
		require.Equal(t, 201, r.Status, r.Raw)
		require.Equal(t, float64(head), r.Body["through"])
		select {
		case <-l.exit:
			l.exit <- nil
		case <-time.After(60 * time.Second):
			t.Fatalf("ledgerd was not killed after the first deletion batch:\n%s", l.Logs())
		}
		l = clock.start(t, db, args...)
		var st Resp
		require.Eventually(t, func() bool {
			st = l.Do("GET", "/v1/ns/aged/prune", "")
			return st.Status == 200 && st.Body["kept_through"] == float64(head)
		}, 60*time.Second, 20*time.Millisecond, "the deletion resumes at start: %s", st.Raw)
		assert.Equal(t, float64(head), st.Body["pruned_through"], st.Raw)
		assert.Equal(t, false, st.Body["prunes"].([]any)[0].(map[string]any)["deleting"], st.Raw)
		assert.Equal(t, 410, l.Do("GET", fmt.Sprintf("/v1/ns/aged/receipts/%d", head), "").Status)
		assert.Equal(t, 410, l.Do("GET", "/v1/ns/aged/effects/resume-0299", "").Status)
		assert.Equal(t, float64(head+1), l.Do("GET", "/v1/ns/aged/head", "").Body["seq"], "the prune receipt, nothing more")
	})
}
