// Package gen writes large, valid ledgers quickly, for benchmarks and the
// 10-million-receipt run: reserve+commit pairs on distinct keys and inputs,
// linked and hashed exactly as ledgerd would, inserted in big transactions
// with fsync off (the data is synthetic), then the key index built.
package gen

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"strconv"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
)

// T0 is the recorded_at of the first generated receipt (unix ms).
const T0 = 1764475200000

// Ledger writes a new ledger of n receipts at path (which must not exist)
// and returns its head. Its default namespace is inline (SPEC §14): the
// receipts carry their values. progress, if set, is called every million receipts.
func Ledger(ctx context.Context, path string, n int, progress func(done int)) (ledger.Head, error) {
	return LedgerTTL(ctx, path, n, 0, progress)
}

// LedgerTTL is Ledger with a default namespace whose keys expire keyTTL ms
// after their outcome (SPEC §12): one that can be pruned (§16).
func LedgerTTL(ctx context.Context, path string, n int, keyTTL uint64, progress func(done int)) (ledger.Head, error) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	db, err := sqlite.OpenStore(ctx, path, sqlite.Options{Logger: quiet, Payloads: ledger.PayloadsInline, KeyTTL: keyTTL}, false)
	if err != nil {
		return ledger.Head{}, err
	}
	if err := db.Close(); err != nil {
		return ledger.Head{}, err
	}
	raw, err := sql.Open("sqlite3", path+"?_journal_mode=WAL&_synchronous=OFF&_cache_size=-262144")
	if err != nil {
		return ledger.Head{}, err
	}
	defer raw.Close()
	raw.SetMaxOpenConns(1)
	var h chain.Hasher
	head := ledger.Head{Hash: chain.ZeroHash}
	const perTx = 100_000
	for start := 1; start <= n; start += perTx {
		if err := insert(ctx, raw, &h, &head, start, min(start+perTx-1, n)); err != nil {
			return head, err
		}
		if progress != nil && (start+perTx-1)/1_000_000 != (start-1)/1_000_000 {
			progress(min(start+perTx-1, n))
		}
	}
	if err := raw.Close(); err != nil {
		return head, err
	}
	db, err = sqlite.OpenStore(ctx, path, sqlite.Options{Logger: quiet}, false)
	if err != nil {
		return head, err
	}
	return head, db.Close() // opening built the key index
}

func insert(ctx context.Context, raw *sql.DB, h *chain.Hasher, head *ledger.Head, from, to int) error {
	tx, err := raw.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	stmt, err := tx.PrepareContext(ctx, `INSERT INTO ns_receipts VALUES (0, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`) // the default namespace
	if err != nil {
		return err
	}
	for i := from; i <= to; i++ {
		pair := uint64((i + 1) / 2)
		r := chain.Receipt{Seq: uint64(i), Kind: chain.KindReserve, IdempotencyKey: UUIDLike("key", pair),
			ExecutionID: UUIDLike("exec", pair), Attempt: 1, Tool: "payments.refund", Effect: chain.EffectWrite,
			InputHash:  fmt.Sprintf("sha256:%064d", pair),
			RecordedAt: T0 + pair, LeaseExpiresAt: T0 + pair + 30_000}
		if i%2 == 0 {
			r.Kind, r.Outcome, r.ExternalRef, r.Result, r.RefSeq, r.LeaseExpiresAt = chain.KindCommit,
				chain.OutcomeSucceeded, "re_"+strconv.Itoa(i), `{"amount":1200,"currency":"eur"}`, uint64(i-1), 0
		}
		r.PrevHash = head.Hash
		r.Hash = h.Hash(head.Hash, &r)
		if _, err := stmt.ExecContext(ctx, r.Seq, r.Kind, r.IdempotencyKey, r.KeyGenerated, r.ExecutionID, r.Attempt, r.Tool,
			r.Effect, r.Idempotent, r.InputHash, r.Outcome, r.ExternalRef, r.Result, r.ErrorCode, r.ErrorMessage,
			r.Retryable, r.LeaseExpiresAt, r.RefSeq, r.Actor, r.Note, r.RecordedAt, r.PrevHash[:], r.Hash[:]); err != nil {
			return fmt.Errorf("insert %d: %w", i, err)
		}
		*head = ledger.Head{Seq: r.Seq, Hash: r.Hash}
	}
	return tx.Commit()
}

// UUIDLike returns a deterministic, uniformly spread UUID-shaped string for
// (salt, n): keys and execution ids of generated ledgers land at random
// positions of their indexes, as real ones do (sequential names would
// append to the end of every b-tree and hide the cost of random inserts).
func UUIDLike(salt string, n uint64) string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], n)
	sum := sha256.Sum256(append([]byte(salt), b[:]...))
	x := hex.EncodeToString(sum[:16])
	return x[:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:32]
}
