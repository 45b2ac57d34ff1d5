package verify_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/mod/sumdb/note"
	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/tlog"
	"github.com/effect-ledger/effect-ledger/verify"
)

// sliceSource yields receipts from memory (a hand-written fake Source).
type sliceSource []chain.Receipt

func (s sliceSource) Receipts(_ context.Context, after uint64, fn func(*chain.Receipt) error) error {
	for i := range s {
		if s[i].Seq > after {
			if err := fn(&s[i]); err != nil {
				return err
			}
		}
	}
	return nil
}

// proverFunc is a ConsistencyProver from a function.
type proverFunc func(ctx context.Context, from, to int64) ([]tlog.Hash, error)

func (f proverFunc) ConsistencyProof(ctx context.Context, from, to int64) ([]tlog.Hash, error) {
	return f(ctx, from, to)
}

var _ verify.ConsistencyProver = proverFunc(nil)

// makeChain links n receipts whose external_ref starts with tag.
func makeChain(n int, tag string) sliceSource {
	var out sliceSource
	var prev chain.Hash
	for i := range n {
		r := chain.Link(uint64(i), prev, chain.Receipt{Kind: chain.KindReserve, IdempotencyKey: fmt.Sprintf("key-%06d", i),
			ExecutionID: "exec-1", Attempt: 1, Tool: "t", Effect: chain.EffectWrite, ExternalRef: tag, RecordedAt: 1})
		out = append(out, r)
		prev = r.Hash
	}
	return out
}

// memTree stores a source's tree hashes for proofs.
type memTree struct{ hashes []tlog.Hash }

func (m *memTree) ReadHashes(idx []int64) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(idx))
	for i, x := range idx {
		out[i] = m.hashes[x]
	}
	return out, nil
}

func treeOf(t *testing.T, src sliceSource) *memTree {
	t.Helper()
	m := &memTree{}
	for i := range src {
		hs, err := sumdb.StoredHashesForRecordHash(int64(i), tlog.LeafHash(src[i].Hash), m)
		require.NoError(t, err)
		m.hashes = append(m.hashes, hs...)
	}
	return m
}

type logKey struct {
	signer note.Signer
	v      note.Verifier
}

func newLogKey(t *testing.T) logKey {
	t.Helper()
	skey, vkey, err := tlog.GenerateKey("ex.test")
	require.NoError(t, err)
	s, _, _, err := tlog.LoadSignerText(skey, "ex.test")
	require.NoError(t, err)
	v, err := tlog.NewVerifier(vkey)
	require.NoError(t, err)
	return logKey{s, v}
}

func (k logKey) sign(t *testing.T, src sliceSource, n int) []byte {
	t.Helper()
	root, err := tlog.TreeHash(int64(n), treeOf(t, src[:n]))
	require.NoError(t, err)
	msg, err := tlog.Sign(tlog.Checkpoint{Origin: "ex.test/default", Size: int64(n), Root: root}, k.signer)
	require.NoError(t, err)
	return msg
}

func ruleList(vs []verify.Violation) []string {
	var out []string
	for _, v := range vs {
		out = append(out, v.Rule)
	}
	return out
}

func TestCheckpointCheck(t *testing.T) {
	ctx := context.Background()
	k := newLogKey(t)
	good := makeChain(40, "ok")
	cp := k.sign(t, good, 30)
	forked := makeChain(50, "forked") // another history under the same key
	for _, tt := range []struct {
		desc     string
		src      sliceSource
		note     []byte
		previous []byte
		prover   verify.ConsistencyProver
		want     []string
	}{
		{"OK", good, cp, nil, nil, nil},
		{"OK with an earlier checkpoint kept", good, k.sign(t, good, 40), k.sign(t, good, 12), nil, nil},
		{"OK given an older checkpoint than the kept one", good, k.sign(t, good, 12), cp, nil, nil},
		{"truncated", good[:20], cp, nil, nil, []string{verify.RuleCheckpointMismatch}},
		{"rewritten suffix", append(good[:25:25], makeChain(40, "x")[25:]...), cp, nil, nil, []string{verify.RuleCheckpointMismatch}},
		{"rewritten after the checkpoint only", append(good[:30:30], makeChain(40, "x")[30:]...), cp, nil, nil, nil},
		{"fork at the same size", forked, k.sign(t, forked, 30), cp, nil, []string{verify.RuleCheckpointMismatch, verify.RuleCheckpointFork}},
		{"fork, the log's proof fails", forked, k.sign(t, forked, 45), cp, proverFunc(func(ctx context.Context, from, to int64) ([]tlog.Hash, error) {
			return tlog.ProveConsistency(to, from, treeOf(t, forked))
		}), []string{verify.RuleCheckpointMismatch, verify.RuleCheckpointFork}},
		{"fork, the log has no proof", forked, k.sign(t, forked, 45), cp, proverFunc(func(ctx context.Context, from, to int64) ([]tlog.Hash, error) {
			return nil, errors.New("not_checkpointed")
		}), []string{verify.RuleCheckpointMismatch, verify.RuleCheckpointFork}},
		{"chain cut below the kept checkpoint, checkpoints consistent", good[:20], k.sign(t, good, 10), cp, proverFunc(func(ctx context.Context, from, to int64) ([]tlog.Hash, error) {
			return tlog.ProveConsistency(to, from, treeOf(t, good))
		}), []string{verify.RuleCheckpointMismatch}},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			c := &verify.CheckpointCheck{Note: tt.note, Verifier: k.v, Previous: tt.previous, Prover: tt.prover}
			res, err := c.Check(ctx, tt.src)
			require.NoError(t, err)
			assert.Equal(t, tt.want, ruleList(res.Violations), "%+v", res.Violations)
		})
	}

	t.Run("ErrWrongKey", func(t *testing.T) {
		other := newLogKey(t)
		_, err := (&verify.CheckpointCheck{Note: other.sign(t, good, 30), Verifier: k.v}).Check(ctx, good)
		assert.ErrorIs(t, err, verify.ErrCheckpoint)
		assert.ErrorIs(t, err, tlog.ErrCheckpointSignature)
	})
	t.Run("ErrOrigin", func(t *testing.T) {
		msg, err := tlog.Sign(tlog.Checkpoint{Origin: "elsewhere.test/default", Size: 1, Root: tlog.EmptyRoot}, k.signer)
		require.NoError(t, err)
		_, err = (&verify.CheckpointCheck{Note: msg, Verifier: k.v}).Check(ctx, good)
		assert.ErrorIs(t, err, tlog.ErrCheckpointOrigin)
	})
	t.Run("ErrAnotherNamespace", func(t *testing.T) {
		// The same chain, signed as namespace payments's: the root fits,
		// the origin does not.
		root, err := tlog.TreeHash(30, treeOf(t, good[:30]))
		require.NoError(t, err)
		msg, err := tlog.Sign(tlog.Checkpoint{Origin: "ex.test/payments", Size: 30, Root: root}, k.signer)
		require.NoError(t, err)
		_, err = (&verify.CheckpointCheck{Note: msg, Verifier: k.v, Namespace: "default"}).Check(ctx, good)
		assert.ErrorIs(t, err, verify.ErrCheckpoint)
		assert.ErrorIs(t, err, tlog.ErrCheckpointOrigin)
		_, err = (&verify.CheckpointCheck{Note: cp, Verifier: k.v, Namespace: "default", Previous: msg}).Check(ctx, good)
		assert.ErrorIs(t, err, tlog.ErrCheckpointOrigin, "nor as the state file's checkpoint")
		res, err := (&verify.CheckpointCheck{Note: msg, Verifier: k.v, Namespace: "payments"}).Check(ctx, good)
		require.NoError(t, err)
		assert.Empty(t, res.Violations)
	})
	t.Run("Latest", func(t *testing.T) {
		res, err := (&verify.CheckpointCheck{Note: k.sign(t, good, 12), Verifier: k.v, Previous: cp}).Check(ctx, good)
		require.NoError(t, err)
		assert.Equal(t, cp, res.Latest, "the larger checkpoint is kept")
	})
}
