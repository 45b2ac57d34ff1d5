package ledger

import (
	"context"
	"errors"
	"fmt"

	"github.com/effect-ledger/effect-ledger/chain"
)

// endLeaseWindow bounds how far back from the head EndLeases looks for
// reservations (a reservation further back has long seen its lease end,
// unless it is a task's of up to a day on a very busy chain).
const endLeaseWindow = 100_000

// EndLeases ends, as interrupted, the reservations still holding their
// lease whose reserve receipt dead says belongs to a process known to be
// gone (ledger-mcp at start-up: an earlier process of its own embedded
// ledger, killed mid-call). Nothing is cut short outside the chain: each
// gets the receipt a runtime retry of the same execution would get, a
// reserve (attempt one past the execution's last, ref_seq the dead
// reservation, the same actor, so an approval it consumed still covers
// it) whose lease is the shortest the contract allows (MinLeaseMS), so
// the key becomes interrupted as a lease that ran out does (SPEC §3): a
// non-idempotent key answers unsafe_resume and waits for a person, an
// idempotent one is taken over by the next retry. It returns the keys
// ended.
func (n *Namespace) EndLeases(ctx context.Context, dead func(*chain.Receipt) bool) ([]string, error) {
	head, err := n.chain.Head(ctx)
	if err != nil {
		return nil, fmt.Errorf("end leases: %w", err)
	}
	f := ReceiptFilter{Kind: chain.KindReserve, Limit: MaxPageLimit}
	if head.Seq > endLeaseWindow {
		f.After = head.Seq - endLeaseWindow
	}
	var ended []string
	for {
		page, next, err := n.chain.ListReceipts(ctx, f)
		if err != nil {
			return ended, fmt.Errorf("end leases: %w", err)
		}
		for i := range page {
			// Only what was there when it started, and never a lease
			// already ended (the shortest lease is the end's own).
			r := &page[i]
			if r.Seq > head.Seq || r.LeaseExpiresAt-r.RecordedAt <= MinLeaseMS {
				continue
			}
			if dead(r) {
				ok, err := n.endLease(ctx, r)
				if err != nil {
					return ended, fmt.Errorf("end lease of %s: %w", r.IdempotencyKey, err)
				}
				if ok {
					ended = append(ended, r.IdempotencyKey)
				}
			}
		}
		if next == nil || *next >= head.Seq {
			return ended, nil
		}
		f.After = *next
	}
}

// errEndLeaseGated: the policy in force denies the tool, or needs an
// approval the dead execution did not consume.
var errEndLeaseGated = errors.New("end lease: the policy in force gates the tool")

// endLease appends the reserve that ends rsv's lease, if rsv is still its
// key's reservation, with no outcome and its lease running, and the
// policy in force lets its execution reserve again without a person.
func (n *Namespace) endLease(ctx context.Context, rsv *chain.Receipt) (bool, error) {
	var ok bool
	err := n.submit(ctx, rsv.IdempotencyKey, func(ctx context.Context, t *batchTx) error {
		ok = false
		now := t.Now()
		k, found, err := t.Key(ctx, rsv.IdempotencyKey)
		if err != nil || !found || k.ReserveSeq != rsv.Seq || k.finalized() || now >= k.LeaseExpiresAt {
			return err
		}
		last, _, err := t.MaxAttempt(ctx, k.Key, rsv.ExecutionID, k.FirstSeq)
		if err != nil {
			return err
		}
		a := reserveArgs{key: k.Key, execution: rsv.ExecutionID, attempt: last + 1, tool: k.Tool, effect: k.Effect,
			idempotent: k.Idempotent, leaseMS: MinLeaseMS, actor: rsv.Actor}
		res, err := appendReserve(ctx, t, now, &a, &k, k.ReserveSeq, reserveEndLease)
		var refused *Error
		if errors.Is(err, errEndLeaseGated) || errors.As(err, &refused) {
			return nil // the policy in force gates the tool, or refuses: it waits out its lease
		}
		if err != nil {
			return err
		}
		ok = res.Status == StatusReserved
		return nil
	})
	return ok, err
}
