package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/keyindex"
)

// The reads of a file that ledgerd serves go through the key index; a
// Reader alone (reader.go) scans the receipts for the same answers.

// GetKey returns a key's state and receipts from the index and the file.
func (c *chainWriter) GetKey(ctx context.Context, key string) (*ledger.KeyView, error) {
	if err := ledger.CheckKeyPath(key); err != nil {
		return nil, err
	}
	if err := c.indexReadable(); err != nil {
		return nil, err
	}
	k, seqs, found, err := c.idx.KeySeqs(c.ns, key)
	if err != nil {
		return nil, fmt.Errorf("get key: %w: %w", ledger.ErrIO, err)
	}
	if !found {
		return nil, ledger.Errorf(ledger.ECodeUnknownKey, "no such idempotency key")
	}
	if kept := c.prunedMark().Kept; kept > 0 {
		if k.FirstSeq <= kept {
			return keyView(&k, nil, c.clock()), nil // pruned (SPEC §16): the domain answers 410
		}
		for len(seqs) > 0 && seqs[0] <= kept {
			seqs = seqs[1:] // an earlier generation's receipts
		}
	}
	receipts, err := c.receiptsAt(ctx, seqs)
	if err != nil {
		return nil, fmt.Errorf("get key: %w", err)
	}
	if err := c.fillFingerprint(ctx, &k, receipts); err != nil {
		return nil, fmt.Errorf("get key: %w", err)
	}
	return keyView(&k, receipts, c.clock()), nil
}

// fillFingerprint sets the fingerprint of an index record from its first
// reserve: among receipts when it is there, else read from the file.
func (c *chainWriter) fillFingerprint(ctx context.Context, k *ledger.KeyRecord, receipts []chain.Receipt) error {
	for i := range receipts {
		if receipts[i].Seq == k.FirstSeq {
			k.Tool, k.Effect, k.InputHash = receipts[i].Tool, receipts[i].Effect, receipts[i].InputHash
			return nil
		}
	}
	r, err := c.receiptOrNil(ctx, k.FirstSeq)
	if err != nil {
		return err
	}
	if r == nil {
		return fmt.Errorf("the first reserve of key %q, receipt %d, is missing", k.Key, k.FirstSeq)
	}
	k.Tool, k.Effect, k.InputHash = r.Tool, r.Effect, r.InputHash
	return nil
}

// keyView is the ledger.KeyView of a key record and the key's receipts.
func keyView(k *ledger.KeyRecord, receipts []chain.Receipt, now uint64) *ledger.KeyView {
	var final chain.Receipt
	for i := range receipts {
		if receipts[i].Seq == k.FinalSeq {
			final = receipts[i]
		}
	}
	return &ledger.KeyView{IdempotencyKey: k.Key, State: ledger.StateOf(k, &final, now),
		Tool: k.Tool, Effect: k.Effect, Idempotent: k.Idempotent, InputHash: k.InputHash,
		FirstSeq: k.FirstSeq, FinalSeq: k.FinalSeq, Receipts: receipts}
}

// receiptsAt reads the receipts at seqs in one read transaction.
func (c *chainWriter) receiptsAt(ctx context.Context, seqs []uint64) ([]chain.Receipt, error) {
	if len(seqs) == 0 {
		return nil, nil
	}
	tx, err := c.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, classify(err)
	}
	defer func() { _ = tx.Rollback() }()
	st, err := tx.PrepareContext(ctx, sqlReceiptBySeq)
	if err != nil {
		return nil, classify(err)
	}
	defer func() { _ = st.Close() }()
	out := make([]chain.Receipt, 0, len(seqs))
	for _, seq := range seqs {
		r, err := scanReceipt(st.QueryRowContext(ctx, c.args(seq)...))
		if err != nil {
			return nil, fmt.Errorf("read receipt %d: %w", seq, classify(err))
		}
		out = append(out, r)
	}
	return out, nil
}

// ListReceipts answers a filtered page from the most selective posting
// list of the filters (key, execution, tool, kind), checking the other
// filters on each receipt; an unfiltered page is a range of the file.
func (c *chainWriter) ListReceipts(ctx context.Context, f ledger.ReceiptFilter) ([]chain.Receipt, *uint64, error) {
	if err := f.Check(); err != nil {
		return nil, nil, err
	}
	field, value := keyindex.Field(0), ""
	for _, p := range []struct {
		f keyindex.Field
		v string
	}{{keyindex.ByKey, f.Key}, {keyindex.ByExecution, f.ExecutionID}, {keyindex.ByTool, f.Tool}, {keyindex.ByKind, f.Kind}} {
		if p.v != "" {
			field, value = p.f, p.v
			break
		}
	}
	if field == 0 {
		return c.Reader.ListReceipts(ctx, f)
	}
	if err := c.indexReadable(); err != nil {
		return nil, nil, err
	}
	var rs []chain.Receipt
	var readErr error
	err := c.idx.Seqs(c.ns, field, value, f.After, func(seq uint64, _ []byte) (bool, error) {
		r, err := c.Reader.GetReceipt(ctx, seq)
		if err != nil {
			readErr = err
			return false, nil
		}
		if matches(r, f) {
			rs = append(rs, *r)
		}
		return len(rs) <= f.Limit, nil
	})
	if err == nil {
		err = readErr
	}
	if err != nil {
		return nil, nil, fmt.Errorf("list receipts: %w", err)
	}
	rs, next := page(rs, f.Limit)
	return rs, next, nil
}

func matches(r *chain.Receipt, f ledger.ReceiptFilter) bool {
	return (f.Key == "" || r.IdempotencyKey == f.Key) && (f.ExecutionID == "" || r.ExecutionID == f.ExecutionID) &&
		(f.Tool == "" || r.Tool == f.Tool) && (f.Kind == "" || r.Kind == f.Kind)
}

// Keys calls fn for every key record of the index, in key byte order,
// with its fingerprint read from its first reserve.
func (c *chainWriter) Keys(ctx context.Context, fn func(*ledger.KeyRecord) error) error {
	if err := c.indexReadable(); err != nil {
		return err
	}
	st, err := c.r.PrepareContext(ctx, sqlFirstFields)
	if err != nil {
		return fmt.Errorf("keys: %w", classify(err))
	}
	defer func() { _ = st.Close() }()
	return c.idx.Keys(c.ns, func(k *ledger.KeyRecord) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		err := st.QueryRowContext(ctx, c.args(k.FirstSeq)...).Scan(&k.Tool, &k.Effect, &k.InputHash)
		if err != nil && !errors.Is(err, sql.ErrNoRows) { // no first reserve: the verifier reports the record
			return fmt.Errorf("keys: %w", classify(err))
		}
		k.TokenHash = ""
		return fn(k)
	})
}

// KeyDrift compares key's record in the index with what its receipts
// give, read from one snapshot of the index.
func (c *chainWriter) KeyDrift(ctx context.Context, key string) ([]string, error) {
	if err := c.indexReadable(); err != nil {
		return nil, err
	}
	stored, seqs, found, err := c.idx.KeySeqs(c.ns, key)
	if err != nil {
		return nil, fmt.Errorf("key drift: %w", err)
	}
	receipts, err := c.receiptsAt(ctx, seqs)
	if err != nil {
		return nil, fmt.Errorf("key drift: %w", err)
	}
	ttl, err := c.KeyTTL(ctx)
	if err != nil {
		return nil, fmt.Errorf("key drift: %w", err)
	}
	derived, dfound, err := deriveKey(ctx, c.Reader, key, receipts, ttl)
	if err != nil {
		return nil, fmt.Errorf("key drift: %w", err)
	}
	if found {
		if err := c.fillFingerprint(ctx, &stored, receipts); err != nil {
			return nil, fmt.Errorf("key drift: %w", err)
		}
	}
	stored.TokenHash = ""
	return ledger.RecordDrift(&stored, found, &derived, dfound), nil
}

// deriveKey replays a key's receipts (in seq order) into its record,
// without its token hash (ledger.DeriveRecord).
func deriveKey(ctx context.Context, rd *Reader, key string, receipts []chain.Receipt, ttl uint64) (ledger.KeyRecord, bool, error) {
	return ledger.DeriveRecord(key, receipts, ttl, func(seq uint64) (*chain.Receipt, error) { return rd.receiptOrNil(ctx, seq) })
}
