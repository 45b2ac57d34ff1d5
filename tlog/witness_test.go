package tlog_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"golang.org/x/mod/sumdb/note"
	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/testkit/testwitness"
	"github.com/effect-ledger/effect-ledger/tlog"
)

const testOrigin = "log.test/default"

// memLog is an in-memory log: stored tree hashes and signed checkpoints.
type memLog struct {
	t      *testing.T
	signer note.Signer
	vkey   string
	mu     sync.Mutex
	hashes []tlog.Hash
	size   int64
	latest *tlog.Signed
}

func newMemLog(t *testing.T) *memLog {
	skey, vkey, err := tlog.GenerateKey("log.test")
	require.NoError(t, err)
	s, err := note.NewSigner(skey)
	require.NoError(t, err)
	return &memLog{t: t, signer: s, vkey: vkey}
}

// grow appends n leaves and signs a checkpoint of the new size.
func (l *memLog) grow(n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for range n {
		var leaf chain.Hash
		binary.BigEndian.PutUint64(leaf[:], uint64(l.size))
		leaf = sha256.Sum256(leaf[:])
		hs, err := sumdb.StoredHashes(l.size, leaf[:], sumdb.HashReaderFunc(l.read))
		require.NoError(l.t, err)
		l.hashes = append(l.hashes, hs...)
		l.size++
	}
	root, err := sumdb.TreeHash(l.size, sumdb.HashReaderFunc(l.read))
	require.NoError(l.t, err)
	msg, err := tlog.Sign(tlog.Checkpoint{Origin: testOrigin, Size: l.size, Root: root}, l.signer)
	require.NoError(l.t, err)
	l.latest = &tlog.Signed{Size: l.size, Root: root, Note: string(msg)}
}

func (l *memLog) read(idx []int64) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(idx))
	for i, x := range idx {
		if x >= int64(len(l.hashes)) {
			return nil, errors.New("not stored")
		}
		out[i] = l.hashes[x]
	}
	return out, nil
}

func (l *memLog) HashReader(context.Context) sumdb.HashReader {
	return sumdb.HashReaderFunc(func(idx []int64) ([]tlog.Hash, error) {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.read(idx)
	})
}

func (l *memLog) LatestCheckpoint(context.Context) (*tlog.Signed, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.latest, nil
}

// startWitness starts a test witness of l's log on 127.0.0.1.
func startWitness(t *testing.T, l *memLog, name string) (*testwitness.Witness, *httptest.Server, *tlog.Witness) {
	t.Helper()
	w, err := testwitness.New(name, l.vkey, testOrigin)
	require.NoError(t, err)
	srv := httptest.NewServer(w)
	t.Cleanup(srv.Close)
	c, err := tlog.ParseWitness(w.VerifierKey() + "=" + srv.URL)
	require.NoError(t, err)
	return w, srv, c
}

func newWitnessing(t *testing.T, l *memLog, quorum int, ws ...*tlog.Witness) *tlog.Witnessing {
	v, err := tlog.NewVerifier(l.vkey)
	require.NoError(t, err)
	return &tlog.Witnessing{Source: l, Verifier: v, Witnesses: ws, Quorum: quorum}
}

// cosigners counts the valid cosignatures of the served note by vkeys,
// after checking the log's own signature.
func cosigners(t *testing.T, l *memLog, s *tlog.Signed, vkeys ...string) int {
	t.Helper()
	v, err := tlog.NewVerifier(l.vkey)
	require.NoError(t, err)
	_, err = tlog.OpenCheckpoint([]byte(s.Note), v, "default")
	require.NoError(t, err, "the served note still carries the log's valid signature")
	var vs []note.Verifier
	for _, k := range vkeys {
		cv, err := tlog.NewCosignatureVerifier(k)
		require.NoError(t, err)
		vs = append(vs, cv)
	}
	return tlog.CountCosigners([]byte(s.Note), vs)
}

func TestWitnessing_Once(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		l := newMemLog(t)
		w1, _, c1 := startWitness(t, l, "w1.test")
		w2, _, c2 := startWitness(t, l, "w2.test")
		ws := newWitnessing(t, l, 2, c1, c2)
		ctx := context.Background()
		n, err := ws.Once(ctx)
		require.NoError(t, err)
		require.Equal(t, 0, n, "nothing to cosign before the first checkpoint")
		require.Nil(t, ws.Served())
		for _, grow := range []int{1, 6, 1, 300} {
			l.grow(grow)
			n, err = ws.Once(ctx)
			require.NoError(t, err)
			require.Equal(t, 2, n)
			s := ws.Served()
			require.NotNil(t, s)
			require.Equal(t, l.size, s.Size)
			require.Equal(t, 2, cosigners(t, l, s, w1.VerifierKey(), w2.VerifierKey()), s.Note)
			require.Equal(t, 3, strings.Count(s.Note, "\n— "), "the log's signature and two cosignatures:\n%s", s.Note)
			require.Equal(t, l.size, w1.Size(testOrigin), "the witness checked the consistency proof and moved on")
		}
		require.Zero(t, w1.Requests(http.StatusConflict)+w1.Requests(http.StatusUnprocessableEntity))
	})

	t.Run("ErrWitnessDown", func(t *testing.T) {
		l := newMemLog(t)
		_, _, c1 := startWitness(t, l, "w1.test")
		_, srv2, c2 := startWitness(t, l, "w2.test")
		ws := newWitnessing(t, l, 2, c1, c2)
		l.grow(5)
		_, err := ws.Once(context.Background())
		require.NoError(t, err)
		require.Equal(t, int64(5), ws.Served().Size)
		srv2.Close()
		l.grow(3)
		n, err := ws.Once(context.Background())
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, int64(5), ws.Served().Size, "quorum 2 with one witness down keeps the previous checkpoint")
		ws.Quorum = 1
		_, err = ws.Once(context.Background())
		require.NoError(t, err)
		require.Equal(t, int64(8), ws.Served().Size, "quorum 1 moves on")
	})

	t.Run("ErrConflict", func(t *testing.T) {
		l := newMemLog(t)
		w1, _, c1 := startWitness(t, l, "w1.test")
		l.grow(4)
		// The witness cosigned size 4 before this log process started
		// (it remembers sizes in memory only, so it starts from 0).
		c, err := tlog.ParseCheckpoint(tlog.NoteText([]byte(l.latest.Note)))
		require.NoError(t, err)
		w1.SetSize(c)
		l.grow(7)
		ws := newWitnessing(t, l, 1, c1)
		n, err := ws.Once(context.Background())
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, 1, w1.Requests(http.StatusConflict), "the first request, from 0, got 409")
		require.Equal(t, 1, w1.Requests(http.StatusOK), "the retry from the reported size 4 was cosigned")
		require.Equal(t, int64(11), ws.Served().Size)
		require.Equal(t, 1, cosigners(t, l, ws.Served(), w1.VerifierKey()))
	})

	t.Run("ErrInvalidCosignature", func(t *testing.T) {
		l := newMemLog(t)
		good, _, cGood := startWitness(t, l, "good.test")
		bad, _, cBad := startWitness(t, l, "bad.test")
		bad.Corrupt = true
		// A witness whose answer is signed by another key of the same name.
		other, srvOther, _ := startWitness(t, l, "other.test")
		impostor, err := tlog.GenerateCosignatureKey("other.test")
		require.NoError(t, err)
		cOther, err := tlog.ParseWitness(impostor.VerifierKey() + "=" + srvOther.URL)
		require.NoError(t, err)
		ws := newWitnessing(t, l, 1, cGood, cBad, cOther)
		l.grow(3)
		n, err := ws.Once(context.Background())
		require.NoError(t, err)
		require.Equal(t, 1, n, "only the good witness counts")
		s := ws.Served()
		require.NotNil(t, s)
		require.Equal(t, 1, strings.Count(s.Note, "— good.test "), s.Note)
		require.NotContains(t, s.Note, "— bad.test ", "a cosignature that does not verify is dropped")
		require.NotContains(t, s.Note, "— other.test ", "a cosignature by another key is dropped")
		require.Equal(t, 1, cosigners(t, l, s, good.VerifierKey(), bad.VerifierKey(), other.VerifierKey(), impostor.VerifierKey()))

		ws = newWitnessing(t, l, 1, cBad)
		n, err = ws.Once(context.Background())
		require.NoError(t, err)
		require.Zero(t, n)
		require.Nil(t, ws.Served(), "no checkpoint is served on forged cosignatures")
	})

	t.Run("ErrRefused", func(t *testing.T) {
		l := newMemLog(t)
		other := newMemLog(t) // a witness that knows another key for the origin: 403
		_, _, c := startWitness(t, other, "w.test")
		l.grow(2)
		_, err := c.AddCheckpoint(context.Background(), []byte(l.latest.Note), mustParse(t, l.latest.Note), l.HashReader(context.Background()))
		var we *tlog.WitnessError
		require.ErrorAs(t, err, &we)
		require.Equal(t, http.StatusForbidden, we.Status)
		require.Equal(t, tlog.WitnessKeyUnknown, we.Code(), "a 403 is the witness not knowing the log's key (SPEC §9.2)")
		require.Contains(t, err.Error(), "witness_key_unknown")
		require.Equal(t, 1.0, witnessErrorCount(t, "w.test", tlog.WitnessKeyUnknown), "ledger_witness_errors_total")
	})
}

// witnessErrorCount reads ledger_witness_errors_total{witness, error}.
func witnessErrorCount(t *testing.T, witness, code string) float64 {
	t.Helper()
	fams, err := prometheus.DefaultGatherer.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		if f.GetName() != "ledger_witness_errors_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if got["witness"] == witness && got["error"] == code {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func mustParse(t *testing.T, msg string) tlog.Checkpoint {
	c, err := tlog.ParseCheckpoint(tlog.NoteText([]byte(msg)))
	require.NoError(t, err)
	return c
}

func TestNewCosignatureVerifier(t *testing.T) {
	s, err := tlog.GenerateCosignatureKey("w.example.com")
	require.NoError(t, err)
	v, err := tlog.NewCosignatureVerifier(s.VerifierKey())
	require.NoError(t, err)
	require.Equal(t, "w.example.com", v.Name())
	require.Equal(t, s.KeyHash(), v.KeyHash())
	text := "log.test/default\n1\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\n"
	sig, err := s.Sign([]byte(text))
	require.NoError(t, err)
	require.True(t, v.Verify([]byte(text), sig))
	require.False(t, v.Verify([]byte(strings.Replace(text, "\n1\n", "\n2\n", 1)), sig))
	sig[7]++ // another timestamp: the signed message changes
	require.False(t, v.Verify([]byte(text), sig))

	_, logVkey, err := tlog.GenerateKey("log.test")
	require.NoError(t, err)
	for _, tt := range []struct{ desc, vkey string }{
		{"empty", ""},
		{"note key (type 0x01)", logVkey},
		{"bad key id", badKeyID(s.VerifierKey())},
		{"another name", "x" + s.VerifierKey()},
		{"no key", "w.example.com+01020304"},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			_, err := tlog.NewCosignatureVerifier(tt.vkey)
			require.ErrorIs(t, err, tlog.ErrCosignatureKey)
		})
	}
}

func TestParseWitness_Err(t *testing.T) {
	s, err := tlog.GenerateCosignatureKey("w.test")
	require.NoError(t, err)
	for _, spec := range []string{s.VerifierKey(), s.VerifierKey() + "=ftp://x", s.VerifierKey() + "=http://", "x=http://127.0.0.1:1"} {
		_, err := tlog.ParseWitness(spec)
		require.Error(t, err, spec)
	}
	w, err := tlog.ParseWitness(s.VerifierKey() + "=http://127.0.0.1:1/w/")
	require.NoError(t, err)
	require.Equal(t, "http://127.0.0.1:1/w", w.URL)
}

// badKeyID replaces a verifier key's key id.
func badKeyID(vkey string) string {
	p := strings.SplitN(vkey, "+", 3)
	if p[1] == "00000000" {
		p[1] = "00000001"
	} else {
		p[1] = "00000000"
	}
	return strings.Join(p, "+")
}
