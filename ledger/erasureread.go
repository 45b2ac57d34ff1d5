package ledger

import (
	"context"
	"fmt"

	"github.com/effect-ledger/effect-ledger/chain"
)

// Reading an erasure (SPEC §14): its opening, and whether its values are
// gone from the files and the archive.

// PurgedAnswer is the "purged" of an erasure as the API shows it: whether
// the files were rid of the erased values (SQLite), or null where the
// ledger cannot tell (PostgreSQL: its WAL, archives and standbys are the
// operator's; docs/privacy.md).
func (n *Namespace) PurgedAnswer(purged bool) *bool {
	if !n.l.cfg.CanPurge {
		return nil
	}
	return &purged
}

// Erasure returns the opening of the erase receipt at seq: 404
// unknown_erasure when seq is not an erase receipt.
func (n *Namespace) Erasure(ctx context.Context, seq uint64) (*Erasure, *chain.EraseResult, error) {
	r, err := n.chain.GetReceipt(ctx, seq)
	if ErrorCode(err) == ECodeUnknownReceipt || (err == nil && (r == nil || r.Kind != chain.KindErase)) {
		return nil, nil, &Error{Code: ECodeUnknownErasure, Message: fmt.Sprintf("no erase receipt at seq %d", seq)}
	}
	if err != nil {
		return nil, nil, err
	}
	res, _, err := chain.ParseEraseResult(r.Result)
	if err != nil {
		return nil, nil, fmt.Errorf("erase receipt %d: %w", seq, err)
	}
	e, err := n.chain.Erasure(ctx, seq)
	if err != nil {
		return nil, nil, err
	}
	if e == nil {
		return nil, nil, fmt.Errorf("erase receipt %d: its erasure row is missing", seq)
	}
	if e.PurgedAt != 0 {
		if done, err := n.archivePurged(ctx, e); err != nil {
			return nil, nil, err
		} else if !done {
			c := *e
			c.PurgedAt = 0 // the archive still holds some of its values
			e = &c
		}
	}
	return e, res, nil
}
