package ledger

import (
	"context"

	"github.com/effect-ledger/effect-ledger/chain"
)

// EraseAll erases every value the namespace still keeps but the erase
// receipts' reasons, and the inputs its asks showed approvers: `ledgerctl
// namespace forget` runs it before a committed namespace's rows leave the
// ledger file (SPEC §14: forget erases its payloads first). Each
// transaction appends one erase receipt (actor; note reason) of at most
// Config.MaxSweep receipts; it returns the receipts, none when nothing
// kept a value.
func (n *Namespace) EraseAll(ctx context.Context, actor, reason string) ([]ReceiptRef, error) {
	if err := CheckEraseReason(reason); err != nil {
		return nil, err
	}
	var out []ReceiptRef
	for {
		var res *EraseResult
		err := n.submit(ctx, "", func(ctx context.Context, t *batchTx) error {
			fields, full, err := t.collectKept(ctx, t.Head().Seq, t.sparedByForget)
			if err != nil || len(fields) == 0 {
				return err
			}
			res, err = t.eraseCollected(ctx, fields, full, false, actor, reason)
			return err
		})
		if err != nil || res == nil {
			return out, err
		}
		erasures.WithLabelValues(n.name, "request").Inc()
		n.l.logger.InfoContext(ctx, "payloads erased", "namespace", n.name, "seq", res.Receipt.Seq, "count", res.Count)
		out = append(out, *res.Receipt)
		if !res.More {
			return out, nil
		}
	}
}

// sparedByForget spares nothing (KeptPayloads leaves out the erase
// receipts, whose reasons are the audit's), and deletes the input of
// each ask it meets.
func (t *batchTx) sparedByForget(ctx context.Context, kp *KeptPayload) (bool, error) {
	if kp.Kind == chain.KindAsk {
		return false, t.SetAskInputDeadline(ctx, kp.Seq, 0, t.Now())
	}
	return false, nil
}
