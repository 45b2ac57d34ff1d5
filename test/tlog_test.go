package test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// startSigned makes a signing key for origin prefix ex.test and starts
// ledgerd with it; it returns the server and the verifier key.
func startSigned(t *testing.T, dir string, extra ...string) (*Ledgerd, string, string) {
	t.Helper()
	return startSignedEnv(t, dir, nil, extra...)
}

// keygen makes a signing key for origin prefix origin in dir/log.key with
// ledgerctl keygen, failing t unless it exits 0; it returns the key's
// file and the verifier key.
func keygen(t *testing.T, dir, origin string) (key, vkey string) {
	t.Helper()
	key = filepath.Join(dir, "log.key")
	out, stderr, code := ledgerctl(t, "keygen", "--origin", origin, "--out", key)
	require.Equal(t, 0, code, stderr)
	return key, strings.TrimSpace(out)
}

// startSignedEnv is startSigned with env added to ledgerd's environment.
func startSignedEnv(t *testing.T, dir string, env []string, extra ...string) (*Ledgerd, string, string) {
	t.Helper()
	key, vkey := keygen(t, dir, "ex.test")
	fi, err := os.Stat(key)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "the private key is readable only by its owner")
	args := append([]string{"--signing-key", key, "--log-origin", "ex.test", "--checkpoint-interval", "20ms"}, extra...)
	l := startLedgerdEnv(t, env, filepath.Join(dir, "ledger.db"), args...)
	assert.Contains(t, l.Logs(), vkey, "ledgerd logs the verifier key it signs with")
	return l, vkey, key
}

// appendN appends n reserve receipts with keys prefix-0… to the default
// namespace.
func appendN(t *testing.T, l *Ledgerd, prefix string, n int) {
	t.Helper()
	appendNS(t, l, "/v1", prefix, n)
}

// waitCheckpoint waits until the served checkpoint has at least size
// leaves and returns its note.
func waitCheckpoint(t *testing.T, l *Ledgerd, vkey string, size int64) (string, tlog.Checkpoint) {
	t.Helper()
	v, err := tlog.NewVerifier(vkey)
	require.NoError(t, err)
	deadline := time.Now().Add(60 * time.Second)
	for {
		r := l.Do("GET", "/log/default/checkpoint", "")
		if r.Status == 200 {
			assert.Equal(t, "text/plain; charset=utf-8", r.Header.Get("Content-Type"))
			c, err := tlog.OpenCheckpoint([]byte(r.Raw), v, "default")
			require.NoError(t, err, r.Raw)
			if c.Size >= size {
				return r.Raw, c
			}
		} else {
			require.Equal(t, "not_checkpointed", r.Code(), r.Raw)
		}
		require.True(t, time.Now().Before(deadline), "no checkpoint of size %d in 60s:\n%s", size, l.Logs())
		time.Sleep(20 * time.Millisecond)
	}
}

func TestVerifiableLog_checkpointsAndProofs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	l, vkey, _ := startSigned(t, dir)
	r := l.Do("GET", "/log/default/checkpoint", "")
	assert.Equal(t, 404, r.Status)
	assert.Equal(t, "not_checkpointed", r.Code())
	r = l.Do("GET", "/v1/proof/consistency?from=0", "")
	assert.Equal(t, 400, r.Status, "no checkpoint: no size to prove against")
	assert.Equal(t, "invalid_request", r.Code())

	// Grow the log in waves so that several checkpoints exist.
	rng := rand.New(rand.NewPCG(7, 9))
	var sizes []int64
	hashes := map[uint64]chain.Hash{}
	for w := range 6 {
		appendN(t, l, fmt.Sprintf("wave%d", w), 1+rng.IntN(40))
		head := l.Do("GET", "/v1/head", "")
		_, c := waitCheckpoint(t, l, vkey, int64(head.Body["seq"].(float64)))
		sizes = append(sizes, c.Size)
	}
	list := l.Do("GET", "/v1/receipts?limit=1000", "")
	for _, x := range list.Body["receipts"].([]any) {
		m := x.(map[string]any)
		h, err := chain.ParseHash(m["hash"].(string))
		require.NoError(t, err)
		hashes[uint64(m["seq"].(float64))] = h
	}

	// Proofs of random leaves at random checkpointed sizes verify with
	// transparency-dev/merkle's verifier.
	for range 40 {
		size := sizes[rng.IntN(len(sizes))]
		seq := 1 + rng.Uint64N(uint64(size))
		r := l.Do("GET", fmt.Sprintf("/v1/proof/inclusion?seq=%d&size=%d", seq, size), "")
		require.Equal(t, 200, r.Status, r.Raw)
		var p tlog.InclusionProof
		require.NoError(t, json.Unmarshal([]byte(r.Raw), &p))
		assert.Equal(t, size, p.TreeSize)
		assert.Equal(t, int64(seq-1), p.LeafIndex)
		data := hashes[seq]
		leaf := rfc6962.DefaultHasher.HashLeaf(data[:])
		require.NoError(t, proof.VerifyInclusion(rfc6962.DefaultHasher, uint64(p.LeafIndex), uint64(size), leaf, raw(p.Hashes), p.Root[:]))

		from := sizes[rng.IntN(len(sizes))]
		if from > size {
			from, size = size, from
		}
		r = l.Do("GET", fmt.Sprintf("/v1/proof/consistency?from=%d&to=%d", from, size), "")
		require.Equal(t, 200, r.Status, r.Raw)
		var c tlog.ConsistencyProof
		require.NoError(t, json.Unmarshal([]byte(r.Raw), &c))
		require.NoError(t, proof.VerifyConsistency(rfc6962.DefaultHasher, uint64(from), uint64(size), raw(c.Hashes), c.RootFrom[:], c.RootTo[:]))
	}
	assert.Regexp(t, `"root":"[0-9a-f]{64}"`, l.Do("GET", "/v1/proof/inclusion?seq=1", "").Raw, "lowercase hex")

	// The errors SPEC §9 names.
	last := sizes[len(sizes)-1]
	gap := uncheckpointed(t, l.DB, last)
	for _, tt := range []struct {
		desc, path string
		status     int
		code       string
	}{
		{"seq beyond the tree", fmt.Sprintf("/v1/proof/inclusion?seq=%d", last+1000), 404, "unknown_receipt"},
		{"size not checkpointed", fmt.Sprintf("/v1/proof/inclusion?seq=1&size=%d", gap), 400, "invalid_request"},
		{"size below seq", fmt.Sprintf("/v1/proof/inclusion?seq=%d&size=%d", last, sizes[0]), 400, "invalid_request"},
		{"seq missing", "/v1/proof/inclusion", 400, "invalid_request"},
		{"seq not a number", "/v1/proof/inclusion?seq=x", 400, "invalid_request"},
		{"from above to", fmt.Sprintf("/v1/proof/consistency?from=%d&to=%d", last, sizes[0]), 400, "invalid_request"},
		{"from not checkpointed", fmt.Sprintf("/v1/proof/consistency?from=%d&to=%d", gap, last), 400, "invalid_request"},
		{"unknown receipt proof", "/v1/receipts/99999/proof", 404, "unknown_receipt"},
		{"tile beyond the tree", "/log/default/tile/0/x001/000", 404, "not_found"},
		{"malformed tile", "/log/default/tile/0/abc", 404, "not_found"},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			r := l.Do("GET", tt.path, "")
			assert.Equal(t, tt.status, r.Status, r.Raw)
			assert.Equal(t, tt.code, r.Code(), r.Raw)
		})
	}
	empty := l.Do("GET", fmt.Sprintf("/v1/proof/consistency?from=0&to=%d", last), "")
	require.Equal(t, 200, empty.Status, empty.Raw)
	assert.Contains(t, empty.Raw, `"hashes":[]`)

	// The CLI reads the same log from the server: the checkpoint, and a
	// verify of the whole chain against the checkpoint URL.
	served := l.Do("GET", "/log/default/checkpoint", "").Raw
	out, stderr, code := ledgerctl(t, "checkpoint", "--server", l.URL)
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, served, out)
	out, stderr, code = ledgerctl(t, "checkpoint", "--server", l.URL, "--json")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, fmt.Sprintf(`"tree_size":%d`, last))
	out, stderr, code = ledgerctl(t, "verify", "--server", l.URL, "--checkpoint", l.URL+"/log/default/checkpoint", "--vkey", vkey)
	assert.Equal(t, 0, code, "%s%s", out, stderr)
}

// uncheckpointed returns a tree size below last that no checkpoint has:
// the signer ticks on its own clock, so which sizes it signed while the
// test appended is read from the database (read-only, beside ledgerd).
func uncheckpointed(t *testing.T, path string, last int64) int64 {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
	require.NoError(t, err)
	defer db.Close()
	rows, err := db.Query(`SELECT size FROM ns_checkpoints WHERE ns = 0 ORDER BY size`)
	require.NoError(t, err)
	defer rows.Close()
	signed := map[int64]bool{}
	for rows.Next() {
		var n int64
		require.NoError(t, rows.Scan(&n))
		signed[n] = true
	}
	require.NoError(t, rows.Err())
	for n := int64(1); n < last; n++ {
		if !signed[n] {
			return n
		}
	}
	t.Fatalf("every size from 1 to %d has a checkpoint: no size to refuse", last)
	return 0
}

func raw(hs []tlog.HexHash) [][]byte {
	out := make([][]byte, len(hs))
	for i := range hs {
		out[i] = append([]byte(nil), hs[i][:]...)
	}
	return out
}

func TestVerifiableLog_tiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	clock := newWallClock(t)
	l, vkey, _ := startSignedEnv(t, dir, []string{clock.env()}, "--public-log")
	appendN(t, l, "tile", 300)
	waitCheckpoint(t, l, vkey, 300)

	get := func(path string, token string) (*http.Response, []byte) {
		req, err := http.NewRequest("GET", l.URL+path, nil)
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		var b bytes.Buffer
		_, err = b.ReadFrom(res.Body)
		require.NoError(t, err)
		return res, b.Bytes()
	}
	// A full level-0 tile: 256 hashes, immutable.
	res, full := get("/log/default/tile/0/000", "")
	require.Equal(t, 200, res.StatusCode, string(full))
	assert.Equal(t, "public, max-age=31536000, immutable", res.Header.Get("Cache-Control"))
	require.Len(t, full, 256*32)
	// The partial tile of the remaining 44 leaves, and the level-1 tile.
	res, part := get("/log/default/tile/0/001.p/44", "")
	require.Equal(t, 200, res.StatusCode, string(part))
	assert.NotContains(t, res.Header.Get("Cache-Control"), "immutable")
	require.Len(t, part, 44*32)
	res, l1 := get("/log/default/tile/1/000.p/1", "")
	require.Equal(t, 200, res.StatusCode)
	require.Len(t, l1, 32)
	// Entry bundles: uint16be(32) ‖ chain hash, the leaf data.
	res, entries := get("/log/default/tile/entries/000", "")
	require.Equal(t, 200, res.StatusCode)
	require.Len(t, entries, 256*34)
	first := l.Do("GET", "/v1/receipts/1", "")
	assert.Equal(t, []byte{0, 32}, entries[:2])
	assert.Equal(t, first.Body["hash"], hex.EncodeToString(entries[2:34]))
	// The tiles give the checkpoint's root: hash of the two level-0 subtrees.
	leaf0 := rfc6962.DefaultHasher.HashLeaf(entries[2:34])
	assert.Equal(t, leaf0, full[:32], "tile 0 starts with leaf 0's hash")
	var f tlog.Frontier
	for i := 0; i < 256; i++ {
		var h chain.Hash
		copy(h[:], entries[i*34+2:i*34+34])
		f.Append(h)
	}
	assert.Equal(t, f.Root(), tlog.Hash(l1[:32]), "level-1 hash 0 is the root of the first 256 leaves")

	// Tokens exist: --public-log keeps the log routes open, the rest needs one.
	out, stderr, code := ledgerctl(t, "token", "create", "--db", l.DB, "--role", "reader", "--name", "auditor")
	require.Equal(t, 0, code, stderr)
	token := strings.TrimSpace(out) // stdout holds only the token
	clock.advance(time.Second)      // the server re-reads whether tokens exist every second
	res, _ = get("/log/default/checkpoint", "")
	assert.Equal(t, 200, res.StatusCode, "public log")
	res, _ = get("/v1/proof/inclusion?seq=1", "")
	assert.Equal(t, 401, res.StatusCode, "proofs are API routes: they need a reader token")
	res, body := get("/v1/proof/inclusion?seq=1", token)
	assert.Equal(t, 200, res.StatusCode, "%s", body)
}

func TestVerifiableLog_tilesNeedTokenUnlessPublic(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	clock := newWallClock(t)
	l, vkey, _ := startSignedEnv(t, dir, []string{clock.env()})
	appendN(t, l, "tok", 3)
	waitCheckpoint(t, l, vkey, 3)
	_, stderr, code := ledgerctl(t, "token", "create", "--db", l.DB, "--role", "reader", "--name", "auditor")
	require.Equal(t, 0, code, stderr)
	clock.advance(time.Second) // past the token-existence re-read
	r := l.Do("GET", "/log/default/checkpoint", "")
	assert.Equal(t, 401, r.Status, r.Raw)
	r = l.Do("GET", "/log/default/tile/entries/000.p/3", "")
	assert.Equal(t, 401, r.Status, r.Raw)
}

// A portable receipt is checked with nothing but the file and the
// verifier key; any change to it, a wrong key or another origin fails.
func TestVerifiableLog_portableReceipt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	l, vkey, _ := startSigned(t, dir, "--default-payloads", "inline") // a committed namespace's: TestPortableReceipt_committed
	tok := l.Reserve(t, `{"idempotency_key":"refund-order-1234","execution_id":"exec-1","tool":"payments.refund","effect":"write"}`)
	l.Commit(t, "refund-order-1234", `{"reservation":"`+tok+`","outcome":"succeeded","external_ref":"re_3Pq9","result":{"amount":1200,"currency":"eur"}}`)
	appendN(t, l, "other", 5)
	waitCheckpoint(t, l, vkey, 7)

	out, stderr, code := ledgerctl(t, "prove", "--server", l.URL, "refund-order-1234")
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2, "one portable receipt per receipt of the key")
	file := filepath.Join(dir, "refund.jsonl")
	require.NoError(t, os.WriteFile(file, []byte(out), 0o644))
	out, stderr, code = ledgerctl(t, "check-proof", file, "--vkey", vkey)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "valid: receipt 2 (key refund-order-1234) is in ex.test/default")

	dbOut, stderr, code := ledgerctl(t, "prove", "--db", l.DB, "2")
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, lines[1], strings.TrimSpace(dbOut), "the same proof from the file")

	vfile := filepath.Join(dir, "log.vkey")
	require.NoError(t, os.WriteFile(vfile, []byte(vkey+"\n"), 0o644))
	one := filepath.Join(dir, "one.json")
	require.NoError(t, os.WriteFile(one, []byte(lines[1]), 0o644))
	_, stderr, code = ledgerctl(t, "check-proof", one, "--vkey", vfile)
	require.Equal(t, 0, code, stderr)

	_, otherVkey, err := tlog.GenerateKey("ex.test")
	require.NoError(t, err)
	_, elsewhere, err := tlog.GenerateKey("other.test")
	require.NoError(t, err)
	for _, tt := range []struct {
		desc    string
		edit    func(s string) string
		vkey    string
		wantOut string
	}{
		// SPEC §9.1: result_text is hashed, and the result must be its value.
		{"result changed", func(s string) string { return strings.Replace(s, `"amount":1200`, `"amount":9200`, 1) }, vkey,
			"receipt 2: the embedded result does not equal result_text"},
		{"result and result_text changed", func(s string) string {
			return strings.Replace(strings.Replace(s, `"amount":1200`, `"amount":9200`, 1), `\"amount\":1200`, `\"amount\":9200`, 1)
		}, vkey, "do not hash"},
		{"external_ref changed with its hash kept", func(s string) string { return strings.Replace(s, "re_3Pq9", "re_forge", 1) }, vkey, "do not hash"},
		{"another receipt's hash and fields", func(s string) string { return swapReceipt(t, s, lines[0]) }, vkey, "inclusion"},
		{"proof hash flipped", func(s string) string { return flipInclusion(t, s) }, vkey, "inclusion"},
		{"checkpoint root edited", func(s string) string { return editCheckpointRoot(t, s) }, vkey, "signature"},
		{"wrong key, same name", func(s string) string { return s }, otherVkey, "signature"},
		{"key of another origin", func(s string) string { return s }, elsewhere, "signature"},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			f := filepath.Join(t.TempDir(), "p.json")
			require.NoError(t, os.WriteFile(f, []byte(tt.edit(lines[1])), 0o644))
			out, stderr, code := ledgerctl(t, "check-proof", f, "--vkey", tt.vkey)
			assert.Equal(t, 1, code, "%s%s", out, stderr)
			assert.Contains(t, out, "INVALID")
			assert.Contains(t, out, tt.wantOut)
		})
	}
	_, _, code = ledgerctl(t, "check-proof", file)
	assert.Equal(t, 2, code, "usage: no --vkey")
	_, _, code = ledgerctl(t, "check-proof", filepath.Join(dir, "missing.json"), "--vkey", vkey)
	assert.Equal(t, 2, code, "I/O error")

	// Not yet checkpointed: a receipt appended after the last checkpoint
	// while the signer is away.
	require.NoError(t, l.Stop())
	l2 := StartLedgerd(t, l.DB)
	appendN(t, l2, "late", 1)
	r := l2.Do("GET", "/v1/receipts/8/proof", "")
	assert.Equal(t, 404, r.Status, r.Raw)
	assert.Equal(t, "not_checkpointed", r.Code())
}

func swapReceipt(t *testing.T, s, other string) string {
	var p, o map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(s), &p))
	require.NoError(t, json.Unmarshal([]byte(other), &o))
	p["receipt"] = o["receipt"]
	p["leaf_index"] = o["leaf_index"]
	b, err := json.Marshal(p)
	require.NoError(t, err)
	return string(b)
}

func flipInclusion(t *testing.T, s string) string {
	var p tlog.PortableReceipt
	require.NoError(t, json.Unmarshal([]byte(s), &p))
	p.Inclusion[0][0] ^= 1
	b, err := json.Marshal(p)
	require.NoError(t, err)
	return string(b)
}

func editCheckpointRoot(t *testing.T, s string) string {
	var p tlog.PortableReceipt
	require.NoError(t, json.Unmarshal([]byte(s), &p))
	c, err := tlog.ParseCheckpoint(tlog.NoteText([]byte(p.Checkpoint)))
	require.NoError(t, err)
	old := c.Text()
	c.Root[0] ^= 1
	p.Checkpoint = strings.Replace(p.Checkpoint, old, c.Text(), 1)
	b, err := json.Marshal(p)
	require.NoError(t, err)
	return string(b)
}

// rewriteSuffix edits receipt seq's result and rehashes it and every later
// receipt, as a careful tamperer would; rebuild-index then makes the
// derived state agree. The chain alone is intact again.
func rewriteSuffix(t *testing.T, path string, seq uint64) {
	t.Helper()
	rd, err := sqlite.OpenReader(context.Background(), path, sqlite.Options{})
	require.NoError(t, err)
	rs, _, err := rd.ListReceipts(context.Background(), ledger.ReceiptFilter{After: seq - 1, Limit: 1000})
	require.NoError(t, err)
	require.NoError(t, rd.Close())
	db, err := sql.Open("sqlite3", path)
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Exec(`DROP TRIGGER ns_receipts_no_update`)
	require.NoError(t, err)
	prev := rs[0].PrevHash
	for i, r := range rs {
		if i == 0 {
			r.ExternalRef = "forged"
		}
		r = chain.Link(r.Seq-1, prev, r)
		_, err := db.Exec(`UPDATE ns_receipts SET external_ref = ?, prev_hash = ?, hash = ? WHERE ns = 0 AND seq = ?`, r.ExternalRef, r.PrevHash[:], r.Hash[:], r.Seq)
		require.NoError(t, err)
		prev = r.Hash
	}
}

// Each tampering an auditor fears, on a copy of a ledger whose checkpoint
// was published before: the chain check alone misses the careful ones;
// the checkpoint catches every one.
// requireCaughtByCheckpoint verifies the tampered ledger db without and
// with the checkpoint file cp (its signer's key vkey): without it the
// ledger verifies only when cleanSelf, with it verify exits 1 naming
// rule. It returns the JSON report of the run with the checkpoint.
func requireCaughtByCheckpoint(t *testing.T, db, cp, vkey string, cleanSelf bool, rule string) string {
	t.Helper()
	out, _, code := ledgerctl(t, "verify", "--db", db, "--json")
	if cleanSelf {
		require.Equal(t, 0, code, "without the checkpoint the tampered chain looks intact: %s", out)
	} else {
		require.Equal(t, 1, code, out)
	}
	out, _, code = ledgerctl(t, "verify", "--db", db, "--checkpoint", cp, "--vkey", vkey, "--json")
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, `"rule":"`+rule+`"`)
	return out
}

func TestVerifiableLog_tamperCaughtByCheckpoint(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	clock := newPastClock(t)
	l, vkey, _ := startSignedEnv(t, dir, []string{clock.env()}, "--default-payloads", "inline") // the values are edited in the chain
	populate(t, l, clock)
	appendN(t, l, "bulk", 20)
	note, c := waitCheckpoint(t, l, vkey, 26)
	require.NoError(t, l.Stop())
	cpFile := filepath.Join(dir, "checkpoint.txt")
	require.NoError(t, os.WriteFile(cpFile, []byte(note), 0o644))

	_, stderr, code := ledgerctl(t, "verify", "--db", l.DB, "--checkpoint", cpFile, "--vkey", vkey)
	require.Equal(t, 0, code, stderr)

	for _, tt := range []struct {
		desc      string
		tamper    func(path string)
		cleanSelf bool // the chain alone still verifies
		wantRule  string
	}{
		{"edit in place", func(p string) {
			editLedger(t, p, `UPDATE receipts SET external_ref = 'forged' WHERE seq = 4`)
		}, false, "hash_mismatch"},
		{"delete a receipt", func(p string) {
			editLedger(t, p, `DELETE FROM receipts WHERE seq = 10`)
		}, false, "seq_gap"},
		{"truncate, derived state rebuilt", func(p string) {
			editLedger(t, p, fmt.Sprintf(`DELETE FROM receipts WHERE seq > %d`, c.Size-5))
			_, stderr, code := ledgerctl(t, "rebuild-index", "--db", p)
			require.Equal(t, 0, code, stderr)
		}, true, "checkpoint_mismatch"},
		{"rewrite a suffix with recomputed hashes", func(p string) {
			rewriteSuffix(t, p, 4)
			_, stderr, code := ledgerctl(t, "rebuild-index", "--db", p)
			require.Equal(t, 0, code, stderr)
		}, true, "checkpoint_mismatch"},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "tampered.db")
			testkit.CopyFile(t, l.DB, p)
			tt.tamper(p)
			out := requireCaughtByCheckpoint(t, p, cpFile, vkey, tt.cleanSelf, tt.wantRule)
			if tt.cleanSelf {
				assert.Contains(t, out, `"rule":"checkpoint_mismatch"`)
			}
		})
	}
}

// Forged checkpoints are rejected (exit 2: they prove nothing), and a
// checkpoint that forks the one verified before is a checkpoint_fork.
func TestVerifiableLog_forgedAndForked(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	l, vkey, key := startSigned(t, dir)
	appendN(t, l, "a", 5)
	note, _ := waitCheckpoint(t, l, vkey, 5)
	cpA := filepath.Join(dir, "a.txt")
	require.NoError(t, os.WriteFile(cpA, []byte(note), 0o644))
	require.NoError(t, l.Stop())
	state := filepath.Join(dir, "state.json")
	_, stderr, code := ledgerctl(t, "verify", "--db", l.DB, "--checkpoint", cpA, "--vkey", vkey, "--state", state)
	require.Equal(t, 0, code, stderr)
	st, err := os.ReadFile(state)
	require.NoError(t, err)
	assert.Contains(t, string(st), `"checkpoint":"ex.test/default\n5\n`)

	// Wrong key, wrong origin: rejected before anything is compared.
	_, otherVkey, err := tlog.GenerateKey("ex.test")
	require.NoError(t, err)
	_, stderr, code = ledgerctl(t, "verify", "--db", l.DB, "--checkpoint", cpA, "--vkey", otherVkey)
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "signature")
	skey, err := os.ReadFile(key)
	require.NoError(t, err)
	signer, _, _, err := tlog.LoadSignerText(strings.TrimSpace(string(skey)), "ex.test")
	require.NoError(t, err)
	c, err := tlog.ParseCheckpoint(tlog.NoteText([]byte(note)))
	require.NoError(t, err)
	c.Origin = "ex.test/payments"
	forged, err := tlog.Sign(c, signer)
	require.NoError(t, err)
	c.Origin = "other.example/default"
	forged2, err := tlog.Sign(c, signer)
	require.NoError(t, err)
	for _, f := range [][]byte{forged2} {
		p := filepath.Join(t.TempDir(), "forged.txt")
		require.NoError(t, os.WriteFile(p, f, 0o644))
		_, stderr, code = ledgerctl(t, "verify", "--db", l.DB, "--checkpoint", p, "--vkey", vkey)
		assert.Equal(t, 2, code, stderr)
		assert.Contains(t, stderr, "origin")
	}
	p := filepath.Join(t.TempDir(), "ns.txt")
	require.NoError(t, os.WriteFile(p, forged, 0o644))
	_, stderr, code = ledgerctl(t, "verify", "--db", l.DB, "--checkpoint", p, "--vkey", vkey, "--state", state)
	assert.Equal(t, 2, code, stderr)
	assert.Contains(t, stderr, "origin", "the state's checkpoint is of another origin")

	// Another history signed with the same key: it verifies on its own
	// ledger, but not after the checkpoint verified before.
	dir2 := t.TempDir()
	l2 := StartLedgerd(t, filepath.Join(dir2, "ledger.db"), "--signing-key", key, "--log-origin", "ex.test", "--checkpoint-interval", "20ms")
	appendN(t, l2, "b", 8)
	noteB, _ := waitCheckpoint(t, l2, vkey, 8)
	require.NoError(t, l2.Stop())
	cpB := filepath.Join(dir2, "b.txt")
	require.NoError(t, os.WriteFile(cpB, []byte(noteB), 0o644))
	_, stderr, code = ledgerctl(t, "verify", "--db", l2.DB, "--checkpoint", cpB, "--vkey", vkey)
	require.Equal(t, 0, code, stderr)
	out, stderr, code := ledgerctl(t, "verify", "--db", l2.DB, "--checkpoint", cpB, "--vkey", vkey, "--state", state, "--json")
	assert.Equal(t, 1, code, stderr)
	assert.Contains(t, out, `"rule":"checkpoint_fork"`)
	assert.Contains(t, out, "ex.test/default\\n5\\n", "the report prints both notes")
	st2, err := os.ReadFile(state)
	require.NoError(t, err)
	assert.Equal(t, string(st), string(st2), "a failed run keeps the state")
}

// An OpenSSH Ed25519 key file and the same key in a real ssh-agent sign
// checkpoints that verify with the verifier key keygen --from derives.
func TestVerifiableLog_sshKeys(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "id_ed25519")
	out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ledger", "-f", key).CombinedOutput()
	require.NoError(t, err, "%s", out)
	vout, stderr, code := ledgerctl(t, "keygen", "--origin", "ex.test", "--from", key)
	require.Equal(t, 0, code, stderr)
	vkey := strings.TrimSpace(vout)

	l := StartLedgerd(t, filepath.Join(dir, "ledger.db"), "--signing-key", key, "--log-origin", "ex.test", "--checkpoint-interval", "20ms")
	appendN(t, l, "ssh", 3)
	waitCheckpoint(t, l, vkey, 3)
	require.NoError(t, l.Stop())

	sock := filepath.Join(dir, "agent.sock")
	agent := exec.Command("ssh-agent", "-D", "-a", sock)
	require.NoError(t, agent.Start())
	t.Cleanup(func() { _ = agent.Process.Kill(); _ = agent.Wait() })
	for i := 0; ; i++ {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		require.Less(t, i, 200, "ssh-agent did not create its socket")
		time.Sleep(10 * time.Millisecond)
	}
	env := append(os.Environ(), "SSH_AUTH_SOCK="+sock)
	add := exec.Command("ssh-add", key)
	add.Env = env
	out, err = add.CombinedOutput()
	require.NoError(t, err, "%s", out)
	fp, err := exec.Command("ssh-keygen", "-l", "-E", "sha256", "-f", key+".pub").Output()
	require.NoError(t, err)
	fingerprint := strings.Fields(string(fp))[1]
	require.True(t, strings.HasPrefix(fingerprint, "SHA256:"), string(fp))
	require.NoError(t, os.Remove(key), "the private key now lives only in the agent")

	t.Setenv("SSH_AUTH_SOCK", sock) // inherited by the binaries below
	vout, stderr, code = ledgerctl(t, "keygen", "--origin", "ex.test", "--from", "ssh-agent:"+fingerprint)
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, vkey, strings.TrimSpace(vout), "the same verifier key from the agent")

	l = StartLedgerd(t, l.DB, "--signing-key", "ssh-agent:"+fingerprint, "--log-origin", "ex.test", "--checkpoint-interval", "20ms")
	appendN(t, l, "agent", 3)
	waitCheckpoint(t, l, vkey, 6)
	out2, stderr, code := ledgerctl(t, "prove", "--server", l.URL, "5")
	require.Equal(t, 0, code, stderr)
	pf := filepath.Join(dir, "p.json")
	require.NoError(t, os.WriteFile(pf, []byte(out2), 0o644))
	_, stderr, code = ledgerctl(t, "check-proof", pf, "--vkey", vkey)
	assert.Equal(t, 0, code, stderr)

	_, code = runLedgerd(t, "--db", filepath.Join(dir, "x.db"), "--listen", "127.0.0.1:0", "--signing-key", "ssh-agent:SHA256:nope")
	assert.NotEqual(t, 0, code, "an unknown agent identity is refused at start")
}

// keygen never overwrites a key; ledgerd refuses to start with a key it
// cannot use, naming the reason.
func TestVerifiableLog_keyErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	key, _ := keygen(t, dir, "ex.test")
	before, err := os.ReadFile(key)
	require.NoError(t, err)
	_, stderr, code := ledgerctl(t, "keygen", "--origin", "ex.test", "--out", key)
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "exists")
	after, err := os.ReadFile(key)
	require.NoError(t, err)
	assert.Equal(t, before, after, "the existing key is untouched")
	_, _, code = ledgerctl(t, "keygen", "--origin", "bad+name", "--out", filepath.Join(dir, "k2"))
	assert.Equal(t, 2, code)

	junk := filepath.Join(dir, "junk.key")
	require.NoError(t, os.WriteFile(junk, []byte("hello"), 0o600))
	for _, tt := range []struct {
		desc string
		args []string
		want string
	}{
		{"key of another origin", []string{"--signing-key", key, "--log-origin", "other.test"}, `the key is for "ex.test"`},
		{"missing key file", []string{"--signing-key", filepath.Join(dir, "nope.key")}, "no such file"},
		{"not a key", []string{"--signing-key", junk}, "neither a note key nor an OpenSSH private key"},
		{"bad interval", []string{"--signing-key", key, "--log-origin", "ex.test", "--checkpoint-interval", "1ms"}, "--checkpoint-interval"},
		{"handover key without a signing key", []string{"--handover-key", key, "--log-origin", "ex.test"}, "--handover-key needs --signing-key"},
		{"handover key is the signing key", []string{"--signing-key", key, "--handover-key", key, "--log-origin", "ex.test"}, "--handover-key is the --signing-key"},
		{"handover key of another origin", []string{"--signing-key", key, "--handover-key", junk, "--log-origin", "ex.test"}, "--handover-key: signing key"},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			out, code := runLedgerd(t, append([]string{"--db", filepath.Join(dir, "l.db"), "--listen", "127.0.0.1:0"}, tt.args...)...)
			assert.NotEqual(t, 0, code)
			assert.Contains(t, out, tt.want)
			assert.NoFileExists(t, filepath.Join(dir, "l.db"), "nothing is created before the key is loaded")
		})
	}
}
