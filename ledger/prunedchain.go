package ledger

import (
	"context"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"

	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// KeptChain wraps a namespace's chain with the reads of its pruned prefix
// (SPEC §16): a receipt or key pruned is 410 pruned, listings start after
// it, and tree and chain hashes over deleted bodies come from the kept
// tiles. Every reader of a namespace goes through it: the API, the proofs
// and tiles, the signer and witnesses, ledgerctl. The verifier reads the
// driver itself.
func KeptChain(c Chain) Chain {
	if k, ok := c.(keptChain); ok {
		return k
	}
	return keptChain{c}
}

type keptChain struct{ Chain }

// PrunedLog is a namespace's log and its pruned prefix, as a driver
// reads them.
type PrunedLog interface {
	LogReader
	PruneReader
}

// KeptLog wraps c so that its tree and chain hashes over deleted bodies
// come from the kept tiles (the verifier's reader of a pruned ledger).
func KeptLog(c PrunedLog) PrunedLog { return keptLog{c} }

type keptLog struct{ PrunedLog }

func (c keptChain) pruned(ctx context.Context) (PruneMark, error) { return c.Chain.Pruned(ctx) }
func (c keptChain) again(ctx context.Context, m *PruneMark, err error) bool {
	return keptLog{c.Chain}.again(ctx, m, err)
}

// HashReader reads stored tree hashes, those over deleted bodies
// recomputed from the kept tiles.
func (c keptChain) HashReader(ctx context.Context) sumdb.HashReader {
	return keptLog{c.Chain}.HashReader(ctx)
}

// ReceiptHashes returns chain hashes, those of deleted bodies kept.
func (c keptChain) ReceiptHashes(ctx context.Context, from uint64, n int) ([]chain.Hash, error) {
	return keptLog{c.Chain}.ReceiptHashes(ctx, from, n)
}

// again reports, after a read that failed with err under the pruned
// prefix m, whether a deletion batch that committed between the two
// reads explains it: then the read is made again under the new prefix.
func (c keptLog) again(ctx context.Context, m *PruneMark, err error) bool {
	if err == nil {
		return false
	}
	now, merr := c.Pruned(ctx)
	if merr != nil || now.Kept == m.Kept && now.Through == m.Through {
		return false
	}
	*m = now
	return true
}

// HashReader reads stored tree hashes, those over deleted bodies
// recomputed from the kept tiles.
func (c keptLog) HashReader(ctx context.Context) sumdb.HashReader {
	return sumdb.HashReaderFunc(func(idx []int64) ([]tlog.Hash, error) {
		m, err := c.Pruned(ctx)
		if err != nil {
			return nil, err
		}
		read := func(ctx context.Context, idx []int64) ([]tlog.Hash, error) {
			return c.PrunedLog.HashReader(ctx).ReadHashes(idx)
		}
		hs, err := keptStoredHashes(ctx, m.Kept, idx, c.KeptTiles, read)
		if c.again(ctx, &m, err) {
			hs, err = keptStoredHashes(ctx, m.Kept, idx, c.KeptTiles, read)
		}
		return hs, err
	})
}

// ReceiptHashes returns chain hashes, those of deleted bodies kept.
func (c keptLog) ReceiptHashes(ctx context.Context, from uint64, n int) ([]chain.Hash, error) {
	m, err := c.Pruned(ctx)
	if err != nil {
		return nil, err
	}
	hs, err := keptReceiptHashes(ctx, m.Kept, from, n, c.KeptTiles, c.PrunedLog.ReceiptHashes)
	if c.again(ctx, &m, err) {
		hs, err = keptReceiptHashes(ctx, m.Kept, from, n, c.KeptTiles, c.PrunedLog.ReceiptHashes)
	}
	return hs, err
}

// GetReceipt is 410 pruned for a receipt of the pruned prefix.
func (c keptChain) GetReceipt(ctx context.Context, seq uint64) (*chain.Receipt, error) {
	m, err := c.pruned(ctx)
	if err != nil {
		return nil, err
	}
	if seq <= m.Through && seq > 0 {
		return nil, prunedReceipt(m, seq)
	}
	r, err := c.Chain.GetReceipt(ctx, seq)
	if c.again(ctx, &m, err) && seq <= m.Through {
		return nil, prunedReceipt(m, seq)
	}
	return r, err
}

// ListReceipts lists the receipts after the pruned prefix (SPEC §16: a
// listing starts after it and says where it starts).
func (c keptChain) ListReceipts(ctx context.Context, f ReceiptFilter) ([]chain.Receipt, *uint64, error) {
	m, err := c.pruned(ctx)
	if err != nil {
		return nil, nil, err
	}
	f.After = max(f.After, m.Through)
	return c.Chain.ListReceipts(ctx, f)
}

// GetKey is 410 pruned for a key whose current generation was pruned, or
// whose receipts were all deleted; a live generation's view leaves out
// the pruned receipts of earlier ones.
func (c keptChain) GetKey(ctx context.Context, key string) (*KeyView, error) {
	v, err := c.Chain.GetKey(ctx, key)
	var e *Error
	if err != nil && !(errors.As(err, &e) && e.Code == ECodeUnknownKey) {
		return nil, err
	}
	m, merr := c.pruned(ctx)
	if merr != nil {
		return nil, merr
	}
	if m.Seq == 0 {
		return v, err
	}
	if err == nil {
		if v.FirstSeq <= m.Through && v.FirstSeq > 0 {
			return nil, prunedKey(key, m, m.Seq)
		}
		live := v.Receipts[:0:0]
		for _, r := range v.Receipts {
			if r.Seq > m.Through {
				live = append(live, r)
			}
		}
		v.Receipts = live
		return v, nil
	}
	if rs, _, lerr := c.ListReceipts(ctx, ReceiptFilter{Key: key, Limit: 1}); lerr != nil {
		return nil, lerr
	} else if len(rs) > 0 {
		return v, err // the gate's receipts only (askedKey): live
	}
	secret, serr := c.Chain.StateKey(ctx)
	if errors.Is(serr, ErrOpenedReadOnly) {
		return v, err
	}
	if serr != nil {
		return nil, serr
	}
	by, perr := c.Chain.WasPruned(ctx, PrunedKeyMAC(secret, key))
	if perr != nil {
		return nil, perr
	}
	if by > 0 {
		return nil, prunedKey(key, m, by)
	}
	return v, err
}

// prunedReceipt is the 410 of a pruned receipt.
func prunedReceipt(m PruneMark, seq uint64) *Error {
	return &Error{Code: ECodePruned,
		Message: fmt.Sprintf("receipt %d was pruned by receipt %d; its body is in the archived segment %s", seq, m.Seq, m.Segment),
		Details: map[string]any{"seq": seq, "pruned_through": m.Through, "prune": m.Seq, "segment": m.Segment}}
}

// prunedKey is the 410 of a pruned key; by is the prune that deleted it.
func prunedKey(key string, m PruneMark, by uint64) *Error {
	return &Error{Code: ECodePruned,
		Message: fmt.Sprintf("the receipts of this key were pruned (receipt %d); a reserve of it starts anew", by),
		Details: map[string]any{"pruned_through": m.Through, "prune": by, "segment": m.Segment}}
}

// prunedKeyInfo is the HKDF info of the key of PrunedKeyMAC.
const prunedKeyInfo = "effect-ledger pruned keys"

// PrunedKeyMAC is what a ledger keeps of a key whose receipts were all
// pruned: the first 8 bytes of HMAC-SHA-256 under a key derived from the
// namespace's secret (Chain.StateKey), so that the table does not confirm
// a guessed key to a reader of the file.
func PrunedKeyMAC(secret []byte, key string) uint64 {
	k, err := hkdf.Key(sha256.New, secret, nil, prunedKeyInfo, 32)
	if err != nil {
		panic(err) // 32 bytes of SHA-256's HKDF cannot fail
	}
	m := hmac.New(sha256.New, k)
	m.Write([]byte(key))
	return binary.BigEndian.Uint64(m.Sum(nil))
}
