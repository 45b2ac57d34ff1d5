package tlog_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/mod/sumdb/note"
	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/tlog"
)

type hashes []tlog.Hash

func (h *hashes) ReadHashes(idx []int64) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(idx))
	for i, x := range idx {
		out[i] = (*h)[x]
	}
	return out, nil
}

// keyLog is a 6-receipt chain whose receipt 3 announces NEW retiring
// OLD, with its tree.
type keyLog struct {
	rs       []chain.Receipt
	tree     *hashes
	old, new note.Signer
	oldV     note.Verifier
	newVKey  string
}

func newKeyLog(t *testing.T) *keyLog {
	t.Helper()
	gen := func() (note.Signer, note.Verifier, string) {
		skey, vkey, err := tlog.GenerateKey("ex.test")
		require.NoError(t, err)
		s, _, _, err := tlog.LoadSignerText(skey, "ex.test")
		require.NoError(t, err)
		v, err := tlog.NewVerifier(vkey)
		require.NoError(t, err)
		return s, v, vkey
	}
	l := &keyLog{tree: &hashes{}}
	l.old, l.oldV, _ = gen()
	l.new, _, l.newVKey = gen()
	var prev chain.Hash
	for i := range 6 {
		r := chain.Receipt{Kind: chain.KindReserve, IdempotencyKey: fmt.Sprintf("key-%06d", i), ExecutionID: "e", Attempt: 1,
			Tool: "t", Effect: chain.EffectWrite, RecordedAt: 1}
		if i == 2 {
			k := chain.KeyResult{VKey: l.newVKey, Retires: tlog.KeyID(l.old)}
			r = chain.Receipt{Kind: chain.KindKey, Result: k.Text(), RecordedAt: 1}
		}
		r = chain.Link(uint64(i), prev, r)
		prev = r.Hash
		hs, err := sumdb.StoredHashesForRecordHash(int64(i), tlog.LeafHash(r.Hash), l.tree)
		require.NoError(t, err)
		*l.tree = append(*l.tree, hs...)
		l.rs = append(l.rs, r)
	}
	return l
}

// portable proves receipt seq under a checkpoint of size n signed by
// signers.
func (l *keyLog) portable(t *testing.T, seq uint64, n int64, signers ...note.Signer) tlog.PortableReceipt {
	t.Helper()
	root, err := tlog.TreeHash(n, l.tree)
	require.NoError(t, err)
	msg, err := tlog.SignCheckpoint(tlog.Checkpoint{Origin: "ex.test/default", Size: n, Root: root}, signers)
	require.NoError(t, err)
	p, err := tlog.ProveInclusion(n, tlog.LeafIndex(seq), l.tree)
	require.NoError(t, err)
	return tlog.PortableReceipt{Receipt: l.rs[seq-1], LeafIndex: tlog.LeafIndex(seq), Inclusion: tlog.HexHashes(p), Checkpoint: string(msg)}
}

// TestCheckPortableKeys: a receipt under NEW's checkpoint is accepted
// with OLD and the bundle's key receipt proven under OLD's; the tamper
// vectors are refused.
func TestCheckPortableKeys(t *testing.T) {
	l := newKeyLog(t)
	main := l.portable(t, 6, 6, l.new)
	good := l.portable(t, 3, 4, l.new, l.old)
	for _, tt := range []struct {
		desc    string
		keys    func() []tlog.PortableReceipt
		wantErr error
	}{
		{"key receipt under a checkpoint both keys signed", func() []tlog.PortableReceipt { return []tlog.PortableReceipt{good} }, nil},
		{"key receipt under OLD's checkpoint", func() []tlog.PortableReceipt { return []tlog.PortableReceipt{l.portable(t, 3, 3, l.old)} }, nil},
		{"no key receipt", func() []tlog.PortableReceipt { return nil }, tlog.ErrCheckpointSignature},
		{"key receipt under NEW's checkpoint only", func() []tlog.PortableReceipt { return []tlog.PortableReceipt{l.portable(t, 3, 4, l.new)} },
			tlog.ErrCheckpointSignature},
		{"key receipt's vkey edited", func() []tlog.PortableReceipt {
			k := good
			k.Receipt.Result = `{"retires":"00000000","vkey":"` + l.newVKey + `"}`
			return []tlog.PortableReceipt{k}
		}, tlog.ErrCheckpointSignature}, // it retires no trusted key: nothing learnt
		{"key receipt's inclusion flipped", func() []tlog.PortableReceipt {
			k := l.portable(t, 3, 4, l.new, l.old)
			k.Inclusion[0][0] ^= 1
			return []tlog.PortableReceipt{k}
		}, tlog.ErrProof},
		{"another kind in keys", func() []tlog.PortableReceipt { return []tlog.PortableReceipt{l.portable(t, 2, 4, l.old)} }, tlog.ErrPortableForm},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			p := main
			p.Keys = tt.keys()
			b, err := json.Marshal(p)
			require.NoError(t, err)
			parsed, err := tlog.ParsePortable(b)
			require.NoError(t, err)
			_, learnt, err := tlog.CheckPortableKeys(parsed, []note.Verifier{l.oldV}, "default")
			if tt.wantErr == nil {
				require.NoError(t, err)
				assert.Equal(t, []string{tlog.KeyID(l.new)}, learnt)
				return
			}
			assert.ErrorIs(t, err, tt.wantErr)
		})
	}
	t.Run("nested keys", func(t *testing.T) {
		k := good
		k.Keys = []tlog.PortableReceipt{good}
		p := main
		p.Keys = []tlog.PortableReceipt{k}
		b, err := json.Marshal(p)
		require.NoError(t, err)
		_, err = tlog.ParsePortable(b)
		assert.ErrorIs(t, err, tlog.ErrPortableForm)
	})
}
