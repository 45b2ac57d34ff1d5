package archive_test

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/mod/sumdb/note"
	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/archive"
	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// testLog is a chain of n receipts, half of them commits with committed
// payloads, with its stored tree and a checkpoint of the whole tree.
type testLog struct {
	rs     []chain.Receipt
	opens  []chain.Opening
	stored []tlog.Hash
	signer note.Signer
	v      note.Verifier
	note   string
}

func (l *testLog) ReadHashes(idx []int64) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(idx))
	for i, x := range idx {
		out[i] = l.stored[x]
	}
	return out, nil
}

func newTestLog(t testing.TB, n int) *testLog {
	t.Helper()
	skey, vkey, err := tlog.GenerateKey("ex.test")
	require.NoError(t, err)
	l := &testLog{}
	l.signer, err = note.NewSigner(skey)
	require.NoError(t, err)
	l.v, err = note.NewVerifier(vkey)
	require.NoError(t, err)
	prev := chain.ZeroHash
	for i := range n {
		r := chain.Receipt{Kind: "reserve", IdempotencyKey: "k" + string(rune('a'+i%26)), Attempt: 1, RecordedAt: uint64(1000 + i)}
		if i%2 == 1 {
			r.Kind, r.Outcome, r.Result, r.ExternalRef = "commit", "succeeded", `{"to":"Ada","n":`+string(rune('0'+i%10))+`}`, "ch_1"
		}
		o := chain.CommitFields(&r)
		r = chain.Link(uint64(i), prev, r)
		hs, err := sumdb.StoredHashes(int64(i), r.Hash[:], l)
		require.NoError(t, err)
		l.stored = append(l.stored, hs...)
		l.rs, l.opens, prev = append(l.rs, r), append(l.opens, o), r.Hash
	}
	root, err := tlog.TreeHash(int64(n), l)
	require.NoError(t, err)
	msg, err := tlog.SignCheckpoint(tlog.Checkpoint{Origin: "ex.test/pay", Size: int64(n), Root: root}, []note.Signer{l.signer})
	require.NoError(t, err)
	l.note = string(msg)
	return l
}

// write writes the segment from..through (1-based seqs).
func (l *testLog) write(t testing.TB, dir string, from, through uint64) string {
	t.Helper()
	front, err := tlog.FrontierNodes(int64(from-1), l)
	require.NoError(t, err)
	prev := chain.ZeroHash
	if from > 1 {
		prev = l.rs[from-2].Hash
	}
	w, err := archive.Create(dir, "pay", from, prev, front)
	require.NoError(t, err)
	for seq := from; seq <= through; seq++ {
		require.NoError(t, w.Receipt(&l.rs[seq-1]))
		for _, f := range chain.PayloadFields {
			if p := l.opens[seq-1].Get(f); p != nil {
				require.NoError(t, w.Payload(seq, f, *p))
			}
		}
	}
	proof, err := tlog.ProveConsistency(int64(len(l.rs)), int64(through), l)
	require.NoError(t, err)
	path, err := w.Finish(l.note, proof, []note.Verifier{l.v})
	require.NoError(t, err)
	return path
}

func TestSegment_writeAndCheck(t *testing.T) {
	l := newTestLog(t, 40)
	dir := t.TempDir()
	for _, r := range [][2]uint64{{1, 40}, {1, 1}, {5, 17}, {17, 32}, {33, 40}} {
		path := l.write(t, dir, r[0], r[1])
		require.Equal(t, filepath.Join(dir, archive.Name("pay", r[0], r[1])), path)
		got, err := archive.Check(path, []note.Verifier{l.v})
		require.NoError(t, err)
		require.Equal(t, r[1]-r[0]+1, uint64(len(got.Hashes)))
		require.Equal(t, l.rs[r[1]-1].Hash, got.Hashes[len(got.Hashes)-1])
		require.Len(t, got.Signers, 1)
		_, err = archive.Check(path, nil) // unsigned: the segment's own consistency
		require.NoError(t, err)
	}
	// A second run of the same segment (cut short after the rename) keeps it.
	l.write(t, dir, 5, 17)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 5, "no temporary directory is left behind")
}

// Every file of a segment is covered: a change anywhere is a fault.
func TestSegment_tampered(t *testing.T) {
	l := newTestLog(t, 20)
	other := newTestLog(t, 20)
	for name, tamper := range map[string]func(t *testing.T, seg string){
		"receipt byte": func(t *testing.T, seg string) {
			edit(t, seg, archive.ReceiptsFile, func(b []byte) []byte { return bytes.Replace(b, []byte(`"reserve"`), []byte(`"reservx"`), 1) })
		},
		"receipt dropped": func(t *testing.T, seg string) {
			edit(t, seg, archive.ReceiptsFile, func(b []byte) []byte { return b[bytes.IndexByte(b, '\n')+1:] })
		},
		"receipts truncated": func(t *testing.T, seg string) {
			edit(t, seg, archive.ReceiptsFile, func(b []byte) []byte { return b[:len(b)-1] })
		},
		"payload value": func(t *testing.T, seg string) {
			edit(t, seg, archive.PayloadsFile, func(b []byte) []byte { return bytes.Replace(b, []byte("Ada"), []byte("Bob"), 1) })
		},
		"payload dropped": func(t *testing.T, seg string) {
			edit(t, seg, archive.PayloadsFile, func(b []byte) []byte { return b[bytes.IndexByte(b, '\n')+1:] })
		},
		"digest": func(t *testing.T, seg string) {
			edit(t, seg, archive.ManifestFile, func(b []byte) []byte { return bytes.Replace(b, []byte(`"sha256:`), []byte(`"sha256:0`), 1) })
		},
		"prev_hash": func(t *testing.T, seg string) {
			edit(t, seg, archive.ManifestFile, func(b []byte) []byte {
				return bytes.Replace(b, []byte(l.rs[3].Hash.String()), []byte(l.rs[2].Hash.String()), 1)
			})
		},
		"another log's checkpoint": func(t *testing.T, seg string) {
			edit(t, seg, archive.ManifestFile, func(b []byte) []byte {
				old, _ := jsonString(l.note)
				now, _ := jsonString(other.note)
				return bytes.Replace(b, old, now, 1)
			})
		},
		"manifest member": func(t *testing.T, seg string) {
			edit(t, seg, archive.ManifestFile, func(b []byte) []byte { return bytes.Replace(b, []byte("{"), []byte(`{"x":1,`), 1) })
		},
		"frontier": func(t *testing.T, seg string) {
			editManifest(t, seg, func(m *archive.Manifest) { m.Frontier[0][0] ^= 1 })
		},
		"consistency proof": func(t *testing.T, seg string) {
			editManifest(t, seg, func(m *archive.Manifest) { m.Consistency[0][0] ^= 1 })
		},
		"through": func(t *testing.T, seg string) {
			editManifest(t, seg, func(m *archive.Manifest) { m.Through, m.Receipts = m.Through-1, m.Receipts-1 })
		},
		"manifest missing": func(t *testing.T, seg string) {
			require.NoError(t, os.Remove(filepath.Join(seg, archive.ManifestFile)))
		},
	} {
		t.Run(name, func(t *testing.T) {
			seg := l.write(t, t.TempDir(), 5, 12)
			tamper(t, seg)
			_, err := archive.Check(seg, []note.Verifier{l.v})
			if name == "manifest missing" {
				require.ErrorIs(t, err, fs.ErrNotExist)
			} else {
				require.ErrorIs(t, err, archive.ErrInvalid)
			}
			t.Log(err)
		})
	}
	// The checkpoint of another key.
	seg := l.write(t, t.TempDir(), 5, 12)
	_, err := archive.Check(seg, []note.Verifier{other.v})
	require.ErrorIs(t, err, archive.ErrInvalid)
}

// Receipts out of order, or a payload of a receipt not yet added, are
// refused by the writer.
func TestWriter_order(t *testing.T) {
	l := newTestLog(t, 6)
	w, err := archive.Create(t.TempDir(), "pay", 1, chain.ZeroHash, nil)
	require.NoError(t, err)
	defer w.Abort()
	require.Error(t, w.Receipt(&l.rs[1]))
	require.NoError(t, w.Receipt(&l.rs[0]))
	require.Error(t, w.Payload(2, chain.FieldResult, chain.Payload{Value: "x"}))
	_, err = archive.Create(t.TempDir(), "../x", 1, chain.ZeroHash, nil)
	require.Error(t, err)
	_, err = archive.Create(t.TempDir(), "pay", 3, chain.ZeroHash, nil) // a frontier of 2 leaves has one node
	require.Error(t, err)
}

func edit(t *testing.T, seg, name string, f func([]byte) []byte) {
	t.Helper()
	path := filepath.Join(seg, name)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	nb := f(b)
	require.False(t, bytes.Equal(b, nb), "the edit changes %s", name)
	require.NoError(t, os.WriteFile(path, nb, 0o644))
}

func editManifest(t *testing.T, seg string, f func(*archive.Manifest)) {
	t.Helper()
	edit(t, seg, archive.ManifestFile, func(b []byte) []byte {
		var m archive.Manifest
		require.NoError(t, json.Unmarshal(b, &m))
		f(&m)
		nb, err := json.Marshal(m)
		require.NoError(t, err)
		return nb
	})
}

func jsonString(s string) ([]byte, error) {
	var b []byte
	b = chain.AppendJSONString(b, s)
	return b, nil
}
