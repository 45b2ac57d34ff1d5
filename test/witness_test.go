package test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/mod/sumdb/note"

	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit/testwitness"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// witnessSetup is a log key and test witnesses of its default namespace,
// each served on 127.0.0.1.
type witnessSetup struct {
	dir, key, vkey string
	witnesses      []*testwitness.Witness
	servers        []*httptest.Server
}

func newWitnessSetup(t *testing.T, names ...string) *witnessSetup {
	t.Helper()
	s := &witnessSetup{dir: t.TempDir()}
	s.key, s.vkey = keygen(t, s.dir, "ex.test")
	for _, n := range names {
		w, err := testwitness.New(n, s.vkey, "ex.test/default")
		require.NoError(t, err)
		srv := httptest.NewServer(w)
		t.Cleanup(srv.Close)
		s.witnesses = append(s.witnesses, w)
		s.servers = append(s.servers, srv)
	}
	return s
}

// start starts ledgerd with every witness and the extra flags.
func (s *witnessSetup) start(t *testing.T, extra ...string) *Ledgerd {
	t.Helper()
	args := []string{"--signing-key", s.key, "--log-origin", "ex.test", "--checkpoint-interval", "20ms"}
	for i, w := range s.witnesses {
		args = append(args, "--witness", w.VerifierKey()+"="+s.servers[i].URL)
	}
	return StartLedgerd(t, filepath.Join(s.dir, "ledger.db"), append(args, extra...)...)
}

// waitCosigned waits until the served checkpoint has at least size leaves
// and returns it with its count of valid cosignatures by vkeys.
func waitCosigned(t *testing.T, l *Ledgerd, logVkey string, size int64, vkeys ...string) (string, tlog.Checkpoint, int) {
	t.Helper()
	raw, c := waitCheckpoint(t, l, logVkey, size)
	var vs []note.Verifier
	for _, k := range vkeys {
		v, err := tlog.NewCosignatureVerifier(k)
		require.NoError(t, err)
		vs = append(vs, v)
	}
	return raw, c, tlog.CountCosigners([]byte(raw), vs)
}

// storedCheckpoint is the largest checkpoint ledgerd has signed and
// stored, read from its database file.
func storedCheckpoint(t *testing.T, path string) int64 {
	t.Helper()
	rd, err := sqlite.OpenReader(context.Background(), path, sqlite.Options{})
	require.NoError(t, err)
	defer func() { _ = rd.Close() }()
	c, err := rd.LatestCheckpoint(context.Background())
	require.NoError(t, err)
	if c == nil {
		return 0
	}
	return c.Size
}

func TestWitness_cosignedCheckpoint(t *testing.T) {
	t.Parallel()
	s := newWitnessSetup(t, "w1.test", "w2.test", "forger.test")
	s.witnesses[2].Corrupt = true // its cosignatures do not verify: ignored
	l := s.start(t, "--witness-quorum", "2")
	appendN(t, l, "wit", 6)
	raw, c, n := waitCosigned(t, l, s.vkey, 6, s.witnesses[0].VerifierKey(), s.witnesses[1].VerifierKey(), s.witnesses[2].VerifierKey())
	assert.Equal(t, 2, n, "served with the two valid cosignatures:\n%s", raw)
	assert.Contains(t, raw, "\n— w1.test ")
	assert.Contains(t, raw, "\n— w2.test ")
	assert.NotContains(t, raw, "— forger.test ", "a cosignature that does not verify is not served")
	assert.Equal(t, 3, strings.Count(raw, "\n— "), "the log's signature and two cosignatures:\n%s", raw)
	assert.Equal(t, c.Size, s.witnesses[0].Size("ex.test/default"))

	// The portable receipt carries the cosigned checkpoint: check-proof
	// verifies the quorum offline.
	out, stderr, code := ledgerctl(t, "prove", "--server", l.URL, "3")
	require.Equal(t, 0, code, stderr)
	file := filepath.Join(s.dir, "receipt-3.json")
	require.NoError(t, os.WriteFile(file, []byte(out), 0o644))
	w1, w2, forger := s.witnesses[0].VerifierKey(), s.witnesses[1].VerifierKey(), s.witnesses[2].VerifierKey()
	w2file := filepath.Join(s.dir, "w2.vkey")
	require.NoError(t, os.WriteFile(w2file, []byte(w2+"\n"), 0o644))
	out, stderr, code = ledgerctl(t, "check-proof", file, "--vkey", s.vkey, "--witness-vkey", w1, "--witness-vkey", w2file, "--quorum", "2")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "cosigned by 2 of 2 witnesses")
	_, _, code = ledgerctl(t, "check-proof", file, "--vkey", s.vkey, "--witness-vkey", w1, "--witness-vkey", w2)
	assert.Equal(t, 0, code, "all witnesses by default")
	out, _, code = ledgerctl(t, "check-proof", file, "--vkey", s.vkey, "--witness-vkey", w1, "--witness-vkey", w2, "--witness-vkey", forger)
	assert.Equal(t, 1, code, "the forger's cosignature is missing: 2 of 3")
	assert.Contains(t, out, "2 of the 3 witnesses cosigned the checkpoint, 3 needed")
	_, _, code = ledgerctl(t, "check-proof", file, "--vkey", s.vkey, "--witness-vkey", w1, "--witness-vkey", forger, "--quorum", "1")
	assert.Equal(t, 0, code)
	// A cosignature line edited in the file no longer counts.
	bad := filepath.Join(s.dir, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(editCosignature(t, readFile(t, file), "w2.test")), 0o644))
	_, _, code = ledgerctl(t, "check-proof", bad, "--vkey", s.vkey, "--witness-vkey", w1, "--witness-vkey", w2, "--quorum", "2")
	assert.Equal(t, 1, code, "an edited cosignature does not verify")
	_, _, code = ledgerctl(t, "check-proof", bad, "--vkey", s.vkey, "--witness-vkey", w1, "--witness-vkey", w2, "--quorum", "1")
	assert.Equal(t, 0, code, "the other one still does")
	for _, args := range [][]string{
		{"--quorum", "1"},
		{"--witness-vkey", w1, "--quorum", "2"},
		{"--witness-vkey", w1, "--quorum", "0"},
		{"--witness-vkey", s.vkey},
	} {
		_, stderr, code = ledgerctl(t, append([]string{"check-proof", file, "--vkey", s.vkey}, args...)...)
		assert.Equal(t, 2, code, "usage error for %v: %s", args, stderr)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

// editCosignature changes one base64 character of the signature of the
// witness name in a portable receipt's JSON.
func editCosignature(t *testing.T, s, name string) string {
	t.Helper()
	i := strings.Index(s, "— "+name+" ")
	require.Positive(t, i, s)
	j := i + len("— "+name+" ") + 10
	c := byte('A')
	if s[j] == 'A' {
		c = 'B'
	}
	return s[:j] + string(c) + s[j+1:]
}

func TestWitness_quorumWithWitnessDown(t *testing.T) {
	t.Parallel()
	s := newWitnessSetup(t, "w1.test", "w2.test")
	l := s.start(t, "--witness-quorum", "2")
	appendN(t, l, "up", 3)
	_, first, n := waitCosigned(t, l, s.vkey, 3, s.witnesses[0].VerifierKey(), s.witnesses[1].VerifierKey())
	require.Equal(t, 2, n)

	s.servers[1].Close() // witness 2 goes down
	appendN(t, l, "down", 4)
	deadline := time.Now().Add(60 * time.Second)
	for storedCheckpoint(t, l.DB) < first.Size+4 {
		require.True(t, time.Now().Before(deadline), "no new checkpoint signed:\n%s", l.Logs())
		time.Sleep(20 * time.Millisecond)
	}
	require.Eventually(t, func() bool { return s.witnesses[0].Size("ex.test/default") >= first.Size+4 }, 60*time.Second, 20*time.Millisecond,
		"the live witness cosigns the new checkpoint")
	// Several witnessing rounds, each failing at the downed witness.
	witnessErrors := func() int {
		for _, line := range strings.Split(l.Do("GET", "/metrics", "").Raw, "\n") {
			if v, ok := strings.CutPrefix(line, `ledger_tlog_witness_requests_total{result="error"} `); ok {
				n, _ := strconv.Atoi(v)
				return n
			}
		}
		return 0
	}
	rounds := witnessErrors() + 3
	require.Eventually(t, func() bool { return witnessErrors() >= rounds }, 60*time.Second, 5*time.Millisecond,
		"the witnessing goes on failing at the downed witness")
	raw, c := waitCheckpoint(t, l, s.vkey, 1)
	assert.Equal(t, first.Size, c.Size, "the previous fully cosigned checkpoint is still served:\n%s", raw)
	assert.Equal(t, 3, strings.Count(raw, "\n— "), raw)
	assert.Contains(t, l.Logs(), "witness did not cosign")
	m := l.Do("GET", "/metrics", "")
	assert.Contains(t, m.Raw, `ledger_tlog_witness_requests_total{result="error"}`)
	assert.NotContains(t, m.Raw, `ledger_tlog_witness_requests_total{result="error"} 0`)
	assert.Contains(t, m.Raw, "ledger_tlog_witnessed_checkpoint_size "+itoa(int(first.Size)))

	// The portable receipt of a receipt past the served checkpoint is not
	// yet available; one before it is, cosigned.
	r := l.Do("GET", "/v1/receipts/"+itoa(int(first.Size+1))+"/proof", "")
	assert.Equal(t, http.StatusNotFound, r.Status, r.Raw)
	assert.Equal(t, "not_checkpointed", r.Code())
	r = l.Do("GET", "/v1/receipts/1/proof", "")
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	assert.Equal(t, raw, r.Body["checkpoint"])
}

func TestWitness_conflictRecovery(t *testing.T) {
	t.Parallel()
	s := newWitnessSetup(t, "w1.test")
	l := s.start(t, "--witness-quorum", "1")
	appendN(t, l, "before", 4)
	_, first, n := waitCosigned(t, l, s.vkey, 4, s.witnesses[0].VerifierKey())
	require.Equal(t, 1, n)
	require.NoError(t, l.Stop())

	// A new ledgerd process knows nothing of what the witness cosigned:
	// it offers "old 0", gets 409 with the witness's size, and retries.
	l = s.start(t, "--witness-quorum", "1")
	appendN(t, l, "after", 5)
	_, c, n := waitCosigned(t, l, s.vkey, first.Size+5, s.witnesses[0].VerifierKey())
	assert.Equal(t, 1, n)
	assert.Equal(t, c.Size, s.witnesses[0].Size("ex.test/default"))
	assert.GreaterOrEqual(t, s.witnesses[0].Requests(http.StatusConflict), 1, "the witness answered 409 at least once")
	assert.Zero(t, s.witnesses[0].Requests(http.StatusUnprocessableEntity), "every consistency proof verified")
	m := l.Do("GET", "/metrics", "")
	assert.NotContains(t, m.Raw, `ledger_tlog_witness_requests_total{result="conflict"} 0`)
}

func TestWitness_flagErrors(t *testing.T) {
	t.Parallel()
	s := newWitnessSetup(t, "w1.test")
	wk := s.witnesses[0].VerifierKey() + "=" + s.servers[0].URL
	for _, tt := range []struct {
		desc string
		args []string
		want string
	}{
		{"no signing key", []string{"--witness", wk}, "--witness needs --signing-key"},
		{"quorum too large", []string{"--signing-key", s.key, "--log-origin", "ex.test", "--witness", wk, "--witness-quorum", "2"}, "--witness-quorum must be between 0"},
		{"log key as witness key", []string{"--signing-key", s.key, "--log-origin", "ex.test", "--witness", s.vkey + "=" + s.servers[0].URL}, "malformed witness verifier key"},
		{"no URL", []string{"--signing-key", s.key, "--log-origin", "ex.test", "--witness", s.witnesses[0].VerifierKey()}, "want <vkey>=<URL>"},
		{"twice", []string{"--signing-key", s.key, "--log-origin", "ex.test", "--witness", wk, "--witness", wk}, "two witnesses are named"},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			out, code := runLedgerd(t, append([]string{"--db", filepath.Join(s.dir, "x.db"), "--listen", "127.0.0.1:0"}, tt.args...)...)
			assert.NotEqual(t, 0, code, out)
			assert.Contains(t, out, tt.want)
			_, statErr := os.Stat(filepath.Join(s.dir, "x.db"))
			assert.True(t, os.IsNotExist(statErr), "no database is created on a flag error")
		})
	}
}
