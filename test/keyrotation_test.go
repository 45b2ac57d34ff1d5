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

	"github.com/effect-ledger/effect-ledger/tlog"
)

// Rotating the log's signing key (SPEC §9.2), through the real binaries.

// rotationKey is a signing key made with ledgerctl keygen.
type rotationKey struct {
	file, vkey, id string
	vkeyFile       string // the verifier key, in a file
}

// newRotationKey makes a key for origin prefix origin in dir/name.
func newRotationKey(t *testing.T, dir, name, origin string) rotationKey {
	t.Helper()
	file := filepath.Join(dir, name)
	out, stderr, code := ledgerctl(t, "keygen", "--origin", origin, "--out", file)
	require.Equal(t, 0, code, stderr)
	vkey := strings.TrimSpace(out)
	v, err := tlog.NewVerifier(vkey)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(file+".vkey", []byte(vkey+"\n"), 0o644))
	return rotationKey{file: file, vkey: vkey, id: tlog.KeyID(v), vkeyFile: file + ".vkey"}
}

// rotationLedger is a ledgerd with tokens, restarted with other keys.
type rotationLedger struct {
	t             *testing.T
	l             *Ledgerd
	db            string
	admin, writer string
	n             int // keys appended so far
}

func (rl *rotationLedger) start(keys ...string) {
	rl.t.Helper()
	if rl.l != nil {
		require.NoError(rl.t, rl.l.Stop())
	}
	args := append([]string{"--log-origin", "ex.test", "--checkpoint-interval", "20ms"}, keys...)
	rl.l = StartLedgerd(rl.t, rl.db, args...)
}

// grow appends a receipt and waits for a checkpoint that covers it,
// returning its note.
func (rl *rotationLedger) grow() string {
	rl.t.Helper()
	rl.n++
	r := rl.l.Do("POST", "/v1/effects/reserve", fmt.Sprintf(`{"idempotency_key":"rot-key-%04d","execution_id":"e","tool":"mail.send","effect":"write"}`, rl.n),
		"Authorization", "Bearer "+rl.writer)
	require.Equal(rl.t, 201, r.Status, r.Raw)
	seq := int64(r.Body["receipt"].(map[string]any)["seq"].(float64))
	return rl.checkpointAt(seq)
}

// checkpointAt waits for a served checkpoint of at least size leaves.
func (rl *rotationLedger) checkpointAt(size int64) string {
	rl.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		r := rl.l.Do("GET", "/log/default/checkpoint", "", "Authorization", "Bearer "+rl.admin)
		if r.Status == 200 {
			c, err := tlog.ParseCheckpoint(tlog.NoteText([]byte(r.Raw)))
			require.NoError(rl.t, err)
			if c.Size >= size {
				return r.Raw
			}
		}
		require.True(rl.t, time.Now().Before(deadline), "no checkpoint of size %d in 60s:\n%s", size, rl.l.Logs())
		time.Sleep(20 * time.Millisecond)
	}
}

// waitLog waits until ledgerd has logged msg.
func (rl *rotationLedger) waitLog(msg string) {
	rl.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(rl.l.Logs(), msg) {
		require.True(rl.t, time.Now().Before(deadline), "ledgerd did not log %q in 30s:\n%s", msg, rl.l.Logs())
		time.Sleep(20 * time.Millisecond)
	}
}

// rotate runs ledgerctl keys rotate with the admin token.
func (rl *rotationLedger) rotate(vkey string, extra ...string) (string, string, int) {
	rl.t.Helper()
	return ledgerctl(rl.t, append([]string{"keys", "rotate", "--server", rl.l.URL, "--token", rl.admin, "--new-vkey", vkey}, extra...)...)
}

// newRotationLedger starts ledgerd on db with keys, then makes its
// admin and writer tokens.
func newRotationLedger(t *testing.T, db string, keys ...string) *rotationLedger {
	rl := &rotationLedger{t: t, db: db}
	rl.start(keys...)
	rl.admin = createToken(t, db, "admin", "admin")
	rl.writer = createToken(t, db, "writer", "writer")
	deadline := time.Now().Add(30 * time.Second)
	for rl.l.Do("GET", "/v1/head", "").Status != 401 { // the server sees the tokens within a second
		require.True(t, time.Now().Before(deadline), "auth not on in 30s")
		time.Sleep(20 * time.Millisecond)
	}
	return rl
}

// TestKeyRotation_handover: a key receipt announces NEW; a ledgerd holding
// only OLD keeps signing with OLD, one started with --signing-key NEW
// --handover-key OLD signs with both, and one with NEW alone with NEW; a
// second rotation of the same key is 409, a writer may not rotate, and a
// ledgerd holding a key the chain never announced signs nothing.
func TestKeyRotation_handover(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, func(t *testing.T, db string) {
		dir := t.TempDir()
		old := newRotationKey(t, dir, "old.key", "ex.test")
		rl := newRotationLedger(t, db, "--signing-key", old.file)
		assert.Equal(t, []string{old.id}, tlog.SignatureKeys([]byte(rl.grow()), "ex.test"))

		next := newRotationKey(t, dir, "new.key", "ex.test")
		other := newRotationKey(t, dir, "other.key", "other.test")
		auth := func(tok string) []string { return []string{"Authorization", "Bearer " + tok} }
		r := rl.l.Do("POST", "/v1/ns/default/signing-keys", `{"vkey":"`+next.vkey+`"}`, auth(rl.writer)...)
		assert.Equal(t, 403, r.Status, "a writer may not rotate: %s", r.Raw)
		for _, body := range []string{`{"vkey":"` + other.vkey + `"}`, `{"vkey":"ex.test+00000000+AAAA"}`, `{}`, `{"vkey":"` + next.vkey + `","retires":"XYZ"}`} {
			r = rl.l.Do("POST", "/v1/ns/default/signing-keys", body, auth(rl.admin)...)
			assert.Equal(t, 400, r.Status, "%s: %s", body, r.Raw)
			assert.Equal(t, "invalid_request", r.Code(), r.Raw)
		}

		out, stderr, code := rl.rotate(next.vkeyFile)
		require.Equal(t, 0, code, stderr)
		assert.Contains(t, out, "key "+next.id+" announced in default, retiring key "+old.id)
		_, stderr, code = rl.rotate(next.vkey)
		assert.Equal(t, 2, code)
		assert.Contains(t, stderr, "key_rotation_conflict")
		third := newRotationKey(t, dir, "third.key", "ex.test")
		r = rl.l.Do("POST", "/v1/signing-keys", `{"vkey":"`+third.vkey+`","retires":"`+old.id+`"}`, auth(rl.admin)...)
		assert.Equal(t, 409, r.Status, r.Raw)
		assert.Equal(t, "key_rotation_conflict", r.Code(), r.Raw)

		if strings.HasPrefix(db, "postgres") {
			// A replica without the announced key does not take the signer
			// lock.
			rl.waitLog("does not hold the signing key the chain announced last")
		} else {
			// OLD alone keeps signing (verifiers will call it retired).
			assert.Equal(t, []string{old.id}, tlog.SignatureKeys([]byte(rl.grow()), "ex.test"))
		}
		// The handover: both keys sign.
		rl.start("--signing-key", next.file, "--handover-key", old.file)
		assert.Equal(t, []string{next.id, old.id}, tlog.SignatureKeys([]byte(rl.grow()), "ex.test"))
		keys := rl.l.Do("GET", "/v1/signing-keys", "", auth(rl.writer)...)
		require.Equal(t, 403, keys.Status, "a writer reads no key history")
		out, stderr, code = ledgerctl(t, "keys", "list", "--server", rl.l.URL, "--token", rl.admin)
		require.Equal(t, 0, code, stderr)
		assert.Contains(t, out, next.id+"  "+old.id)
		assert.Contains(t, out, "signed by: "+next.id+", "+old.id)
		// NEW alone.
		rl.start("--signing-key", next.file)
		assert.Equal(t, []string{next.id}, tlog.SignatureKeys([]byte(rl.grow()), "ex.test"))

		out, stderr, code = ledgerctl(t, "verify", "--db", db)
		require.Equal(t, 0, code, out+stderr)
		out, stderr, code = ledgerctl(t, "receipts", "--db", db, "--kind", "key", "--json")
		require.Equal(t, 0, code, stderr)
		assert.Contains(t, out, `"retires\":\"`+old.id)

		// A key the chain never announced signs nothing.
		rl.start("--signing-key", third.file)
		rl.n++
		r = rl.l.Do("POST", "/v1/effects/reserve", fmt.Sprintf(`{"idempotency_key":"rot-key-%04d","execution_id":"e","tool":"mail.send","effect":"write"}`, rl.n), auth(rl.writer)...)
		require.Equal(t, 201, r.Status, r.Raw)
		if strings.HasPrefix(db, "postgres") {
			rl.waitLog("does not hold the signing key the chain announced last")
		} else {
			rl.waitLog("no signing key of this process is in the chain's active key set")
		}
		cp := rl.l.Do("GET", "/log/default/checkpoint", "", auth(rl.admin)...)
		require.Equal(t, 200, cp.Status, cp.Raw)
		assert.Equal(t, []string{next.id}, tlog.SignatureKeys([]byte(cp.Raw), "ex.test"), "the last checkpoint is NEW's")
		_ = os.Remove(third.file)
	})
}

// signAs signs the body of the checkpoint note with the private key of
// k alone, into a file of dir.
func signAs(t *testing.T, dir, note string, k rotationKey) string {
	t.Helper()
	skey, err := os.ReadFile(k.file)
	require.NoError(t, err)
	signer, _, _, err := tlog.LoadSignerText(strings.TrimSpace(string(skey)), "ex.test")
	require.NoError(t, err)
	c, err := tlog.ParseCheckpoint(tlog.NoteText([]byte(note)))
	require.NoError(t, err)
	msg, err := tlog.Sign(c, signer)
	require.NoError(t, err)
	path := filepath.Join(dir, "by-"+k.id+".txt")
	require.NoError(t, os.WriteFile(path, msg, 0o644))
	return path
}

// TestKeyRotation_verifiers: verify --state learns NEW only through the
// key receipt proven under a checkpoint OLD signed, then calls a
// checkpoint OLD signs alone checkpoint_key_retired and one by a key never
// announced checkpoint_key_unknown; check-proof accepts a receipt under
// NEW's checkpoint given OLD and the bundle's key receipts.
func TestKeyRotation_verifiers(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, func(t *testing.T, db string) {
		dir := t.TempDir()
		old := newRotationKey(t, dir, "old.key", "ex.test")
		next := newRotationKey(t, dir, "new.key", "ex.test")
		stranger := newRotationKey(t, dir, "stranger.key", "ex.test")
		rl := newRotationLedger(t, db, "--signing-key", old.file)
		save := func(name, note string) string {
			p := filepath.Join(dir, name)
			require.NoError(t, os.WriteFile(p, []byte(note), 0o644))
			return p
		}
		cp0 := save("cp0.txt", rl.grow())
		state := filepath.Join(dir, "state.json")
		out, stderr, code := ledgerctl(t, "verify", "--db", db, "--checkpoint", cp0, "--vkey", old.vkeyFile, "--state", state)
		require.Equal(t, 0, code, out+stderr)
		st, err := os.ReadFile(state)
		require.NoError(t, err)
		assert.Contains(t, string(st), `"keys":{"current":["`+old.vkey+`"]}`, "the state keeps the full key")

		// The order docs/operations.md gives: both keys, announce, NEW alone.
		rl.start("--signing-key", next.file, "--handover-key", old.file)
		_, stderr, code = rl.rotate(next.vkey)
		require.Equal(t, 0, code, stderr)
		rl.grow()
		rl.start("--signing-key", next.file)
		note2 := rl.grow()
		cp2 := save("cp2.txt", note2)
		require.Equal(t, []string{next.id}, tlog.SignatureKeys([]byte(note2), "ex.test"))

		// Without the state, OLD alone does not verify NEW's checkpoint
		// unless the chain proves the handover: it does.
		out, stderr, code = ledgerctl(t, "verify", "--db", db, "--checkpoint", cp2, "--vkey", old.vkey)
		require.Equal(t, 0, code, out+stderr)
		// With the state: learnt and kept.
		out, stderr, code = ledgerctl(t, "verify", "--db", db, "--checkpoint", cp2, "--state", state)
		require.Equal(t, 0, code, out+stderr)
		st, err = os.ReadFile(state)
		require.NoError(t, err)
		assert.Contains(t, string(st), `"current":["`+next.vkey+`"],"retired":["`+old.vkey+`"]`)
		assert.Contains(t, string(st), `"retires":"`+old.id+`"`)

		// OLD alone after the handover: retired; a key never announced:
		// unknown, named.
		out, _, code = ledgerctl(t, "verify", "--db", db, "--checkpoint", signAs(t, dir, note2, old), "--state", state, "--json")
		assert.Equal(t, 1, code, out)
		assert.Contains(t, out, `"rule":"checkpoint_key_retired"`)
		out, _, code = ledgerctl(t, "verify", "--db", db, "--checkpoint", signAs(t, dir, note2, stranger), "--state", state, "--json")
		assert.Equal(t, 1, code, out)
		assert.Contains(t, out, `"rule":"checkpoint_key_unknown"`)
		assert.Contains(t, out, stranger.id)
		// With nothing pinned but OLD given, the chain teaches NEW, and a
		// stranger's checkpoint is still unknown.
		out, _, code = ledgerctl(t, "verify", "--db", db, "--checkpoint", signAs(t, dir, note2, stranger), "--vkey", old.vkey, "--json")
		assert.Equal(t, 1, code, out)
		assert.Contains(t, out, `"rule":"checkpoint_key_unknown"`)

		// Online, the server's portable receipts hold the proof of the
		// handover.
		st2 := filepath.Join(dir, "state2.json")
		out, stderr, code = ledgerctl(t, "verify", "--server", rl.l.URL, "--token", rl.admin, "--checkpoint", cp0, "--vkey", old.vkey, "--state", st2)
		require.Equal(t, 0, code, out+stderr)
		out, stderr, code = ledgerctl(t, "verify", "--server", rl.l.URL, "--token", rl.admin, "--checkpoint", cp2, "--state", st2)
		require.Equal(t, 0, code, out+stderr)

		// check-proof: the bundle carries the key receipt.
		c, err := tlog.ParseCheckpoint(tlog.NoteText([]byte(note2)))
		require.NoError(t, err)
		bundle, stderr, code := ledgerctl(t, "prove", "--db", db, fmt.Sprint(c.Size))
		require.Equal(t, 0, code, stderr)
		assert.Contains(t, bundle, `"keys":[`)
		bf := save("bundle.json", bundle)
		out, stderr, code = ledgerctl(t, "check-proof", bf, "--vkey", old.vkey)
		require.Equal(t, 0, code, out+stderr)
		assert.Contains(t, out, "signed by key "+next.id+" announced on the chain")
		out, stderr, code = ledgerctl(t, "check-proof", bf, "--vkey", stranger.vkey, "--vkey", next.vkey)
		require.Equal(t, 0, code, out+stderr, "any one key suffices")
		stripped := save("stripped.json", bundle[:strings.Index(bundle, `,"keys":[`)]+"}\n")
		out, _, code = ledgerctl(t, "check-proof", stripped, "--vkey", old.vkey)
		assert.Equal(t, 1, code, out)
		assert.Contains(t, out, next.id, "the error names the key that signed")
	})
}

func mustVerifier(t *testing.T, vkey string) interface{ KeyHash() uint32 } {
	t.Helper()
	v, err := tlog.NewVerifier(vkey)
	require.NoError(t, err)
	return v
}

// TestKeyRotation_witness: a witness that knows only OLD cosigns the
// handover's checkpoints (OLD's signature is there) and refuses NEW's
// alone with 403, which ledgerd logs and counts as witness_key_unknown.
func TestKeyRotation_witness(t *testing.T) {
	t.Parallel()
	s := newWitnessSetup(t, "w1.test")
	next := newRotationKey(t, s.dir, "new.key", "ex.test")
	witness := "--witness=" + s.witnesses[0].VerifierKey() + "=" + s.servers[0].URL
	l := s.start(t)
	appendN(t, l, "a", 2)
	_, _, n := waitCosigned(t, l, s.vkey, 2, s.witnesses[0].VerifierKey())
	require.Equal(t, 1, n)
	require.NoError(t, l.Stop())

	l = StartLedgerd(t, l.DB, "--signing-key", next.file, "--handover-key", s.key, "--log-origin", "ex.test", "--checkpoint-interval", "20ms", witness)
	_, stderr, code := ledgerctl(t, "keys", "rotate", "--server", l.URL, "--new-vkey", next.vkey)
	require.Equal(t, 0, code, stderr)
	appendN(t, l, "b", 2)
	raw, _, n := waitCosigned(t, l, s.vkey, 5, s.witnesses[0].VerifierKey())
	assert.Equal(t, 1, n, "the witness verifies OLD's signature of the handover's checkpoint")
	assert.Equal(t, []string{next.id, tlog.KeyID(mustVerifier(t, s.vkey))}, tlog.SignatureKeys([]byte(raw), "ex.test"))
	require.NoError(t, l.Stop())

	l = StartLedgerd(t, l.DB, "--signing-key", next.file, "--log-origin", "ex.test", "--checkpoint-interval", "20ms", witness)
	appendN(t, l, "c", 2)
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(l.Logs(), "witness_key_unknown") {
		require.True(t, time.Now().Before(deadline), l.Logs())
		time.Sleep(20 * time.Millisecond)
	}
	fams := metricFamilies(t, l)
	f := fams["ledger_witness_errors_total"]
	require.NotNil(t, f, "ledger_witness_errors_total is exported")
	found := false
	for _, m := range f.GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == "error" && lp.GetValue() == "witness_key_unknown" && m.GetCounter().GetValue() >= 1 {
				found = true
			}
		}
	}
	assert.True(t, found, "%v", f)
}
