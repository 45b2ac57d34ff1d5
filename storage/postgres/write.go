package postgres

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/effect-ledger/effect-ledger/chain"
)

// notifyChannel carries the keys whose reservation ended or whose ask was
// answered, as
// "<store id>\n<namespace>\n<key>\n<key>…" (keys are visible ASCII).
const (
	notifyChannel = "ledger_ended"
	notifyMax     = 7900 // NOTIFY payloads must be under 8000 bytes
)

// SQL of the pipelined write at the end of a run.
const (
	// The batch's rows travel as one array per column. unnest in the
	// select list (the arrays run in lockstep) is ~7× faster for small
	// batches than one multi-argument unnest in FROM, which materialises
	// every array first (1 row: 80 µs against 650 µs).
	sqlInsertReceipts = `INSERT INTO receipts (namespace, ` + receiptColumns + `)
		SELECT $1, unnest($2::bigint[]), unnest($3::text[]), unnest($4::text[]), unnest($5::boolean[]),
			unnest($6::text[]), unnest($7::bigint[]), unnest($8::text[]), unnest($9::text[]),
			unnest($10::boolean[]), unnest($11::text[]), unnest($12::text[]), unnest($13::text[]),
			unnest($14::text[]), unnest($15::text[]), unnest($16::text[]), unnest($17::boolean[]),
			unnest($18::bigint[]), unnest($19::bigint[]), unnest($20::text[]), unnest($21::text[]),
			unnest($22::bigint[]), unnest($23::bytea[]), unnest($24::bytea[])`

	sqlUpsertKeys = `INSERT INTO keys (namespace, idempotency_key, key_generated, tool, effect, input_hash,
			idempotent, first_seq, reserve_seq, lease_expires_at, final_seq, token_hash)
		SELECT $1, unnest($2::text[]), unnest($3::boolean[]), unnest($4::text[]), unnest($5::text[]),
			unnest($6::text[]), unnest($7::boolean[]), unnest($8::bigint[]), unnest($9::bigint[]),
			unnest($10::bigint[]), unnest($11::bigint[]), unnest($12::bytea[])
		ON CONFLICT (namespace, idempotency_key) DO UPDATE SET
			key_generated = EXCLUDED.key_generated, tool = EXCLUDED.tool, effect = EXCLUDED.effect,
			input_hash = EXCLUDED.input_hash, idempotent = EXCLUDED.idempotent,
			first_seq = EXCLUDED.first_seq, reserve_seq = EXCLUDED.reserve_seq,
			lease_expires_at = EXCLUDED.lease_expires_at, final_seq = EXCLUDED.final_seq,
			token_hash = EXCLUDED.token_hash`

	sqlInsertTreeHashes = `INSERT INTO tree_hashes (namespace, idx, hash)
		SELECT $1, unnest($2::bigint[]), unnest($3::bytea[])`

	sqlInsertCheckpoint = `INSERT INTO checkpoints (namespace, size, root, note, signed_at)
		VALUES ($1, $2, $3, $4, $5)`

	sqlInsertBatch = `INSERT INTO batches (batch_id, namespace, last_seq, committed_at) VALUES ($1, $2, $3, $4)`

	sqlHeadCAS = `UPDATE head SET seq = $3, hash = $4, recorded_at = $5, policy_seq = $7
		WHERE namespace = $1 AND seq = $2 AND hash = $6`

	sqlPutAskInput = `INSERT INTO approval_inputs (namespace, ask_seq, input, delete_after) VALUES ($1, $2, $3, $4)
		ON CONFLICT (namespace, ask_seq) DO UPDATE SET input = EXCLUDED.input, delete_after = EXCLUDED.delete_after`

	sqlSetAskInputDeadline = `UPDATE approval_inputs SET delete_after = $3 WHERE namespace = $1 AND ask_seq = $2`

	sqlPurgeAskInputs = `DELETE FROM approval_inputs WHERE namespace = $1 AND delete_after < $2`
)

// write sends the buffered rows, the asked inputs' writes, the batch row,
// the head compare-and-set (policy_seq included) and the NOTIFY of ended
// keys in one pipelined round trip, and returns the batch id.
func (t *tx) write(ctx context.Context) (string, error) {
	ns := t.c.ns
	var b pgx.Batch
	if len(t.receipts) > 0 {
		b.Queue(sqlInsertReceipts, receiptArrays(ns, t.receipts)...)
	}
	if len(t.keys) > 0 {
		b.Queue(sqlUpsertKeys, t.keyArrays()...)
	}
	if len(t.hashes) > 0 {
		idx := make([]int64, len(t.hashes))
		hs := make([][]byte, len(t.hashes))
		for i := range t.hashes {
			idx[i] = t.hashFrom + int64(i)
			hs[i] = t.hashes[i][:]
		}
		b.Queue(sqlInsertTreeHashes, ns, idx, hs)
	}
	if c := t.checkpoint; c != nil {
		b.Queue(sqlInsertCheckpoint, ns, c.Size, c.Root[:], c.Note, int64(c.SignedAt))
	}
	for _, op := range t.askInputs {
		if op.put {
			b.Queue(sqlPutAskInput, ns, int64(op.seq), op.input, int64(op.deleteAfter))
		} else {
			b.Queue(sqlSetAskInputDeadline, ns, int64(op.seq), int64(op.deleteAfter))
		}
	}
	if t.purgeBefore > 0 {
		b.Queue(sqlPurgeAskInputs, ns, int64(t.purgeBefore))
	}
	batchID := newUUID()
	b.Queue(sqlInsertBatch, batchID, ns, int64(t.head.Seq), int64(t.now))
	recordedAt := t.oldRecordedAt
	for i := range t.receipts {
		recordedAt = max(recordedAt, t.receipts[i].RecordedAt)
	}
	b.Queue(sqlHeadCAS, ns, int64(t.oldHead.Seq), int64(t.head.Seq), t.head.Hash[:], int64(recordedAt), t.oldHead.Hash[:],
		int64(t.policySeq))
	for _, p := range notifyPayloads(t.c.s.id, ns, t.ended) {
		b.Queue(`SELECT pg_notify($1, $2)`, notifyChannel, p)
	}
	br := t.conn.SendBatch(ctx, &b)
	var err error
	for i := 0; i < b.Len() && err == nil; i++ {
		var tag pgconn.CommandTag
		tag, err = br.Exec()
		if err == nil && strings.HasPrefix(b.QueuedQueries[i].SQL, "UPDATE head") && tag.RowsAffected() != 1 {
			err = fmt.Errorf("the head of %s moved from %d under its lock", ns, t.oldHead.Seq)
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("write batch: %w", err)
	}
	return batchID, nil
}

// notifyPayloads splits the ended keys of ns into NOTIFY payloads.
func notifyPayloads(id, ns string, keys []string) []string {
	if len(keys) == 0 {
		return nil
	}
	prefix := id + "\n" + ns
	var out []string
	var sb strings.Builder
	sb.WriteString(prefix)
	for _, k := range keys {
		if sb.Len()+1+len(k) > notifyMax && sb.Len() > len(prefix) {
			out = append(out, sb.String())
			sb.Reset()
			sb.WriteString(prefix)
		}
		sb.WriteByte('\n')
		sb.WriteString(k)
	}
	return append(out, sb.String())
}

func newUUID() string {
	var u [16]byte
	_, _ = rand.Read(u[:])
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// keyArrays are the columns of the buffered key records for sqlUpsertKeys.
func (t *tx) keyArrays() []any {
	n := len(t.keyOrder)
	var (
		key, tool, effect, input = make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		gen, idem                = make([]bool, n), make([]bool, n)
		first, reserve           = make([]int64, n), make([]int64, n)
		lease, final             = make([]int64, n), make([]int64, n)
		token                    = make([][]byte, n)
	)
	for i, name := range t.keyOrder {
		k := t.keys[name]
		key[i], gen[i], tool[i], effect[i], input[i], idem[i] = k.Key, k.Generated, k.Tool, k.Effect, k.InputHash, k.Idempotent
		first[i], reserve[i], lease[i], final[i] = int64(k.FirstSeq), int64(k.ReserveSeq), int64(k.LeaseExpiresAt), int64(k.FinalSeq)
		token[i] = []byte(k.TokenHash)
	}
	return []any{t.c.ns, key, gen, tool, effect, input, idem, first, reserve, lease, final, token}
}

// receiptArrays are the columns of rs for sqlInsertReceipts.
func receiptArrays(ns string, rs []chain.Receipt) []any {
	n := len(rs)
	ints := func() []int64 { return make([]int64, n) }
	strs := func() []string { return make([]string, n) }
	bools := func() []bool { return make([]bool, n) }
	seq, attempt, lease, ref, rec := ints(), ints(), ints(), ints(), ints()
	kind, key, exec, tool, effect, input, outcome, ext, result, ecode, emsg, actor, note :=
		strs(), strs(), strs(), strs(), strs(), strs(), strs(), strs(), strs(), strs(), strs(), strs(), strs()
	gen, idem, retry := bools(), bools(), bools()
	prev, hash := make([][]byte, n), make([][]byte, n)
	for i := range rs {
		r := &rs[i]
		seq[i], kind[i], key[i], gen[i], exec[i] = int64(r.Seq), r.Kind, r.IdempotencyKey, r.KeyGenerated, r.ExecutionID
		attempt[i], tool[i], effect[i], idem[i], input[i] = int64(r.Attempt), r.Tool, r.Effect, r.Idempotent, r.InputHash
		outcome[i], ext[i], result[i], ecode[i], emsg[i] = r.Outcome, r.ExternalRef, r.Result, r.ErrorCode, r.ErrorMessage
		retry[i], lease[i], ref[i], actor[i], note[i], rec[i] = r.Retryable, int64(r.LeaseExpiresAt), int64(r.RefSeq), r.Actor, r.Note, int64(r.RecordedAt)
		prev[i], hash[i] = r.PrevHash[:], r.Hash[:]
	}
	return []any{ns, seq, kind, key, gen, exec, attempt, tool, effect, idem, input, outcome, ext, result,
		ecode, emsg, retry, lease, ref, actor, note, rec, prev, hash}
}
