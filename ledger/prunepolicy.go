package ledger

import (
	"context"
	"fmt"

	"github.com/effect-ledger/effect-ledger/chain"
)

// The policy in force once its receipt is pruned (SPEC §16): every prune
// receipt carries the policy in force after its range, so the latest one
// gives it while no live policy receipt follows.

// prunedPolicy is what a prune receipt says of the policy: the policy
// receipt's seq (0: none) and the policy.
type prunedPolicy struct {
	prune, seq uint64
	p          *Policy
}

// policyOfPrune reads the policy prune receipt pruneSeq carries, with read.
func policyOfPrune(ctx context.Context, pruneSeq uint64, read func(context.Context, uint64) (chain.Receipt, error)) (*prunedPolicy, error) {
	r, err := read(ctx, pruneSeq)
	if err != nil {
		return nil, err
	}
	if r.Kind != chain.KindPrune {
		return nil, fmt.Errorf("prune: receipt %d is a %s: %w", pruneSeq, r.Kind, ErrStorageCorrupt)
	}
	res, err := chain.ParsePruneResult(r.Result)
	if err != nil {
		return nil, fmt.Errorf("prune receipt %d: %w", pruneSeq, err)
	}
	pp := &prunedPolicy{prune: pruneSeq, seq: res.Policy.Seq, p: &Policy{}}
	if pp.seq > 0 {
		if pp.p, err = ParsePolicy([]byte(res.Policy.Text)); err != nil {
			return nil, fmt.Errorf("the policy prune receipt %d carries does not parse: %w", pruneSeq, err)
		}
	}
	return pp, nil
}

// policyOfPruned is the policy in force in a namespace whose live receipts
// hold no policy receipt: the one the latest prune carries, if any.
func (n *Namespace) policyOfPruned(ctx context.Context) (*Policy, uint64, error) {
	m, err := n.chain.Pruned(ctx)
	if err != nil || m.Seq == 0 {
		return &Policy{}, 0, err
	}
	pp := n.prunedPol.Load()
	if pp == nil || pp.prune != m.Seq {
		if pp, err = policyOfPrune(ctx, m.Seq, func(ctx context.Context, seq uint64) (chain.Receipt, error) {
			r, err := n.chain.GetReceipt(ctx, seq)
			if err != nil {
				return chain.Receipt{}, err
			}
			return *r, nil
		}); err != nil {
			return nil, 0, err
		}
		n.prunedPol.Store(pp)
	}
	if pp.seq > 0 {
		n.policyCommitted(pp.seq, pp.p)
	}
	return pp.p, pp.seq, nil
}

// prunedPolicy makes the run's policy the one the latest prune carries
// when the chain's latest policy receipt is pruned: the driver's
// PolicySeq may name a receipt whose body is gone.
func (t *batchTx) prunedPolicy(ctx context.Context) error {
	m := t.at.Pruned
	if m.Seq == 0 || t.at.PolicySeq > m.Through {
		return nil
	}
	pp := t.n.prunedPol.Load()
	if pp == nil || pp.prune != m.Seq {
		var err error
		if pp, err = policyOfPrune(ctx, m.Seq, t.Receipt); err != nil {
			return err
		}
	}
	t.at.PolicySeq = pp.seq
	if pp.seq > 0 {
		if t.policies == nil {
			t.policies = map[uint64]*Policy{}
		}
		t.policies[pp.seq] = pp.p
	}
	return nil
}

// Key reads key's record in the run; a record whose generation was pruned
// is not found: a reserve of the key starts anew (SPEC §16).
func (t *batchTx) Key(ctx context.Context, key string) (KeyRecord, bool, error) {
	k, found, err := t.Tx.Key(ctx, key)
	if found && k.FirstSeq <= t.at.Pruned.Through {
		return KeyRecord{}, false, err
	}
	return k, found, err
}

// keptKeyReceipts reads the rotations of the pruned key receipts (SPEC
// §9.2, §16).
func (n *Namespace) keptKeyReceipts(ctx context.Context) ([]KeyRotation, error) {
	rs, err := keptKeyBodies(ctx, n.chain)
	if err != nil {
		return nil, err
	}
	out := make([]KeyRotation, 0, len(rs))
	for i := range rs {
		rot, err := RotationOf(&rs[i])
		if err != nil {
			return nil, err
		}
		out = append(out, rot)
	}
	return out, nil
}

// keptKeyBodies reads the kept bodies of the pruned key receipts, each
// checked against its kept chain hash (a mismatch is ErrStorageCorrupt).
func keptKeyBodies(ctx context.Context, c ChainReader) ([]chain.Receipt, error) {
	bodies, err := c.KeptReceipts(ctx)
	if err != nil || len(bodies) == 0 {
		return nil, err
	}
	out := make([]chain.Receipt, 0, len(bodies))
	for _, b := range bodies {
		var r chain.Receipt
		if err := r.UnmarshalJSON([]byte(b.Body)); err != nil {
			return nil, fmt.Errorf("kept key receipt %d: %w: %w", b.Seq, err, ErrStorageCorrupt)
		}
		hs, err := c.ReceiptHashes(ctx, b.Seq-1, 1)
		if err != nil {
			return nil, err
		}
		if r.Seq != b.Seq || r.Check() != nil || len(hs) != 1 || hs[0] != r.Hash {
			return nil, fmt.Errorf("kept key receipt %d does not match its kept chain hash: %w", b.Seq, ErrStorageCorrupt)
		}
		out = append(out, r)
	}
	return out, nil
}

// refReader reads the receipt a reserve names in the run: ErrPrunedRef
// for a pruned one.
func (t *batchTx) refReader(ctx context.Context) func(uint64) (*chain.Receipt, error) {
	return func(seq uint64) (*chain.Receipt, error) {
		if seq <= t.at.Pruned.Through {
			return nil, ErrPrunedRef
		}
		r, err := t.Receipt(ctx, seq)
		return &r, err
	}
}
