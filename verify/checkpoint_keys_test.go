package verify_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/mod/sumdb/note"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/tlog"
	"github.com/effect-ledger/effect-ledger/verify"
)

// rotKey is a log key with its verifier key text.
type rotKey struct {
	signer note.Signer
	vkey   string
	id     string
}

func newRotKey(t *testing.T) rotKey {
	t.Helper()
	skey, vkey, err := tlog.GenerateKey("ex.test")
	require.NoError(t, err)
	s, _, _, err := tlog.LoadSignerText(skey, "ex.test")
	require.NoError(t, err)
	return rotKey{s, vkey, tlog.KeyID(s)}
}

// rotationChain links n receipts whose receipt at keySeq is a key
// receipt announcing next and retiring old.
func rotationChain(n int, keySeq uint64, next, old rotKey) sliceSource {
	var out sliceSource
	var prev chain.Hash
	for i := range n {
		r := chain.Receipt{Kind: chain.KindReserve, IdempotencyKey: fmt.Sprintf("key-%06d", i), ExecutionID: "exec-1",
			Attempt: 1, Tool: "t", Effect: chain.EffectWrite, RecordedAt: 1}
		if uint64(i+1) == keySeq {
			k := chain.KeyResult{VKey: next.vkey, Retires: old.id}
			r = chain.Receipt{Kind: chain.KindKey, Result: k.Text(), Actor: "admin", RecordedAt: 1}
		}
		r = chain.Link(uint64(i), prev, r)
		out = append(out, r)
		prev = r.Hash
	}
	return out
}

// signBy signs the tree of the first n receipts of src with every key.
func signBy(t *testing.T, src sliceSource, n int, keys ...rotKey) []byte {
	t.Helper()
	root, err := tlog.TreeHash(int64(n), treeOf(t, src[:n]))
	require.NoError(t, err)
	signers := make([]note.Signer, len(keys))
	for i, k := range keys {
		signers[i] = k.signer
	}
	msg, err := tlog.SignCheckpoint(tlog.Checkpoint{Origin: "ex.test/default", Size: int64(n), Root: root}, signers)
	require.NoError(t, err)
	return msg
}

// TestCheckpointCheck_keys: the tamper vectors of key rotation (SPEC
// §9.2). A verifier trusting OLD learns NEW only from the key receipt
// proven under a checkpoint OLD signed.
func TestCheckpointCheck_keys(t *testing.T) {
	ctx := context.Background()
	old, next, stranger := newRotKey(t), newRotKey(t), newRotKey(t)
	src := rotationChain(20, 11, next, old)
	forged := rotationChain(20, 11, stranger, old) // the key receipt rewritten to announce another key
	covering := func(c []byte) verify.Covering {
		return func(context.Context, int64) (*tlog.Signed, error) {
			if c == nil {
				return nil, nil
			}
			cp, err := tlog.ParseCheckpoint(tlog.NoteText(c))
			require.NoError(t, err)
			return &tlog.Signed{Size: cp.Size, Root: cp.Root, Note: string(c)}, nil
		}
	}
	trustOld := verify.KeyTrust{Current: []string{old.vkey}}
	handedOver := verify.KeyTrust{Current: []string{next.vkey}, Retired: []string{old.vkey}}
	for _, tt := range []struct {
		desc     string
		src      sliceSource
		trust    verify.KeyTrust
		note     []byte
		covering []byte
		previous []byte
		want     []string
		learnt   bool // NEW is current after the run
	}{
		{"learnt from the checkpoint, signed by both", src, trustOld, signBy(t, src, 20, next, old), nil, nil, nil, true},
		{"learnt from the first checkpoint covering the key receipt", src, trustOld, signBy(t, src, 20, next), signBy(t, src, 12, next, old), nil, nil, true},
		{"learnt, then OLD alone is retired", src, trustOld, signBy(t, src, 20, old), nil, nil, []string{verify.RuleCheckpointKeyRetired}, true},
		{"kept, then OLD alone is retired", src, handedOver, signBy(t, src, 20, old), nil, nil, []string{verify.RuleCheckpointKeyRetired}, true},
		{"kept, NEW alone", src, handedOver, signBy(t, src, 20, next), nil, nil, nil, true},
		{"no checkpoint by OLD covers the key receipt", src, trustOld, signBy(t, src, 20, next), signBy(t, src, 12, next), signBy(t, src, 5, old),
			[]string{verify.RuleCheckpointKeyUnknown}, false},
		{"a key never announced", src, handedOver, signBy(t, src, 20, stranger), nil, signBy(t, src, 5, old),
			[]string{verify.RuleCheckpointKeyUnknown}, true},
		{"the key receipt rewritten after OLD signed it", forged, trustOld, signBy(t, forged, 20, stranger), signBy(t, src, 12, old), nil,
			[]string{verify.RuleCheckpointMismatch}, false},
		{"a key receipt before the checkpoint's tree is not learnt", src, trustOld, signBy(t, src, 10, old), nil, nil, nil, false},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			trust := tt.trust
			c := &verify.CheckpointCheck{Note: tt.note, Trust: &trust, Covering: covering(tt.covering), Previous: tt.previous}
			res, err := c.Check(ctx, tt.src)
			require.NoError(t, err)
			assert.Equal(t, tt.want, ruleList(res.Violations), "%+v", res.Violations)
			assert.Equal(t, tt.learnt, res.Trust.Current[len(res.Trust.Current)-1] == next.vkey, "%+v", res.Trust)
			if tt.want == nil && tt.learnt {
				assert.Contains(t, res.Trust.Retired, old.vkey)
			}
		})
	}
	t.Run("ErrUnknownKey nothing pinned", func(t *testing.T) {
		other := rotationChain(20, 0, next, old) // no key receipt
		_, err := (&verify.CheckpointCheck{Note: signBy(t, other, 20, stranger), Trust: &trustOld}).Check(ctx, other)
		assert.ErrorIs(t, err, verify.ErrCheckpoint)
		assert.ErrorContains(t, err, stranger.id)
	})
}
