package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// The values of committed payload fields (SPEC §14) live in ns_payloads,
// one row per receipt that has any, keyed by the receipt's row. The domain
// makes the commitments and checks the values; the driver stores and reads
// rows.

// Payloads reads the namespace's payload mode.
func (rd *Reader) Payloads(ctx context.Context) (ledger.PayloadMode, error) {
	var st ledger.NamespaceSettings
	err := rd.r.QueryRowContext(ctx, sqlSettings, rd.args()...).Scan(&st.KeyTTL, &st.Payloads)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return ledger.PayloadsInline, nil
	case err != nil:
		return "", fmt.Errorf("read payload mode: %w", classify(err))
	}
	return st.Payloads, nil
}

// Openings reads the openings of the receipts at seqs.
func (rd *Reader) Openings(ctx context.Context, seqs []uint64) (map[uint64]*chain.Opening, error) {
	return openings(ctx, rd.r, rd.chainRef, seqs)
}

// PayloadRows yields the openings after seq in seq order.
func (rd *Reader) PayloadRows(ctx context.Context, after uint64, fn func(uint64, *chain.Opening) error) error {
	rows, err := rd.r.QueryContext(ctx, sqlPayloadRows, rd.args(after)...)
	if err != nil {
		return fmt.Errorf("read payloads: %w", payloadTable(classify(err)))
	}
	defer func() { _ = rows.Close() }()
	for rows.Next() {
		var seq uint64
		o, err := scanOpening(rows, &seq)
		if err != nil {
			return fmt.Errorf("read payloads: %w", err)
		}
		if err := fn(seq, o); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read payloads: %w", classify(err))
	}
	return nil
}

// Payloads reads the namespace's payload mode.
func (f *lazyChain) Payloads(ctx context.Context) (ledger.PayloadMode, error) {
	return f.rd.Payloads(ctx)
}

// Openings reads the openings of the receipts at seqs.
func (f *lazyChain) Openings(ctx context.Context, seqs []uint64) (map[uint64]*chain.Opening, error) {
	return f.rd.Openings(ctx, seqs)
}

// PayloadRows yields the openings after seq in seq order.
func (f *lazyChain) PayloadRows(ctx context.Context, after uint64, fn func(uint64, *chain.Opening) error) error {
	return f.rd.PayloadRows(ctx, after, fn)
}

// Openings reads the openings of the receipts at seqs, this transaction's
// appends included.
func (t *writeTx) Openings(ctx context.Context, seqs []uint64) (map[uint64]*chain.Opening, error) {
	if err := t.flushPayloads(ctx); err != nil {
		return nil, err
	}
	return openings(ctx, t.tx, t.ref, seqs)
}

func openings(ctx context.Context, q querier, ref chainRef, seqs []uint64) (map[uint64]*chain.Opening, error) {
	out := make(map[uint64]*chain.Opening, len(seqs))
	for _, seq := range seqs {
		o, err := scanOpening(q.QueryRowContext(ctx, sqlOpening, ref.args(seq)...), nil)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			continue
		case err != nil:
			return nil, fmt.Errorf("read payloads of receipt %d: %w", seq, payloadTable(err))
		}
		out[seq] = o
	}
	return out, nil
}

// scanOpening reads a row of payloadColumns (after the seq, when seq is
// not nil).
func scanOpening(row rowScanner, seq *uint64) (*chain.Opening, error) {
	var vals [4]sql.NullString
	var salts [4][]byte
	var erased [4]uint64
	dest := make([]any, 0, 13)
	if seq != nil {
		dest = append(dest, seq)
	}
	for i := range vals {
		dest = append(dest, &vals[i], &salts[i], &erased[i])
	}
	if err := row.Scan(dest...); err != nil {
		return nil, classify(err)
	}
	var o chain.Opening
	for i, f := range chain.PayloadFields {
		switch {
		case vals[i].Valid:
			s, err := chain.SaltFromBytes(salts[i])
			if err != nil {
				return nil, fmt.Errorf("%s: %w", f.Name(), err)
			}
			o.Set(f, &chain.Payload{Value: vals[i].String, Salt: s})
		case erased[i] > 0:
			o.Set(f, &chain.Payload{ErasedBy: erased[i]})
		}
	}
	return &o, nil
}

// payloadBatch is the most rows one INSERT of ns_payloads carries.
const payloadBatch = 32

// putOpening queues the values of receipt rid's committed fields; the
// batch's rows go in one INSERT per payloadBatch rows (flushPayloads),
// one cgo call where there were one per commit.
func (t *writeTx) putOpening(ctx context.Context, rid int64, o *chain.Opening) error {
	t.payloadArgs = append(t.payloadArgs, rid)
	for _, f := range chain.PayloadFields {
		if p := o.Get(f); p != nil && p.ErasedBy == 0 {
			t.payloadArgs = append(t.payloadArgs, p.Value, p.Salt[:])
		} else {
			t.payloadArgs = append(t.payloadArgs, nil, nil)
		}
	}
	if len(t.payloadArgs) == payloadBatch*payloadRowArgs {
		return t.flushPayloads(ctx)
	}
	return nil
}

// payloadRowArgs is the number of values of one row of ns_payloads.
const payloadRowArgs = 1 + 2*len(chain.PayloadFields)

// flushPayloads writes the queued payload rows. Every read of ns_payloads
// in the transaction, and the end of the batch, runs it first.
func (t *writeTx) flushPayloads(ctx context.Context) error {
	n := len(t.payloadArgs) / payloadRowArgs
	if n == 0 {
		return nil
	}
	if _, err := t.tx.StmtContext(ctx, t.stmts.payloads[n]).ExecContext(ctx, t.payloadArgs...); err != nil {
		return fmt.Errorf("store payloads: %w", classify(err))
	}
	t.payloadArgs = t.payloadArgs[:0]
	return nil
}

// ErasePayloads deletes the values of the given fields of each receipt,
// marking them erased by eraseSeq.
func (t *writeTx) ErasePayloads(ctx context.Context, eraseSeq uint64, fields map[uint64]chain.FieldSet) error {
	if err := t.flushPayloads(ctx); err != nil {
		return err
	}
	for seq, set := range fields {
		for _, f := range chain.PayloadFields {
			if !set.Has(f) {
				continue
			}
			col := f.Name()
			q := `UPDATE ns_payloads SET ` + col + ` = NULL, ` + col + `_salt = NULL, ` + col + `_erased = ?3
				WHERE rid = (SELECT rowid FROM ns_receipts WHERE ns = ?1 AND seq = ?2) AND ` + col + ` IS NOT NULL`
			if _, err := t.tx.ExecContext(ctx, q, t.ref.args(seq, eraseSeq)...); err != nil {
				return fmt.Errorf("erase payloads of receipt %d: %w", seq, classify(err))
			}
		}
	}
	return nil
}

// PutErasure stores the opening of an erase receipt's set.
func (t *writeTx) PutErasure(ctx context.Context, e *ledger.Erasure) error {
	if _, err := t.tx.ExecContext(ctx, sqlInsertErasure, t.ref.args(e.Seq, e.Salt[:], chain.RangesText(e.Ranges))...); err != nil {
		return fmt.Errorf("store erasure %d: %w", e.Seq, classify(err))
	}
	for _, m := range e.Subjects {
		if _, err := t.tx.ExecContext(ctx, sqlInsertErasureSubject, t.ref.args(e.Seq, m[:])...); err != nil {
			return fmt.Errorf("store erasure %d: %w", e.Seq, classify(err))
		}
	}
	t.erased = true
	return nil
}

// Erasure reads the opening of the erase receipt at seq, or nil.
func (rd *Reader) Erasure(ctx context.Context, seq uint64) (*ledger.Erasure, error) {
	var salt []byte
	var ranges string
	var purged uint64
	err := rd.r.QueryRowContext(ctx, sqlErasure, rd.args(seq)...).Scan(&salt, &ranges, &purged)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("read erasure %d: %w", seq, payloadTable(classify(err)))
	}
	e, err := erasureOf(seq, salt, ranges, purged)
	if err != nil {
		return nil, err
	}
	return e, rd.erasureSubjects(ctx, sqlErasureSubjects, rd.args(seq), func(_ uint64, m ledger.SubjectMAC) {
		e.Subjects = append(e.Subjects, m)
	})
}

// Erasures yields every erasure of the namespace in seq order.
func (rd *Reader) Erasures(ctx context.Context, fn func(*ledger.Erasure) error) error {
	subjects := map[uint64][]ledger.SubjectMAC{}
	if err := rd.erasureSubjects(ctx, sqlAllErasureSubjects, rd.args(), func(seq uint64, m ledger.SubjectMAC) {
		subjects[seq] = append(subjects[seq], m)
	}); err != nil {
		return err
	}
	rows, err := rd.r.QueryContext(ctx, sqlErasures, rd.args()...)
	if err != nil {
		return fmt.Errorf("read erasures: %w", payloadTable(classify(err)))
	}
	defer func() { _ = rows.Close() }()
	for rows.Next() {
		var seq, purged uint64
		var salt []byte
		var ranges string
		if err := rows.Scan(&seq, &salt, &ranges, &purged); err != nil {
			return fmt.Errorf("read erasures: %w", classify(err))
		}
		e, err := erasureOf(seq, salt, ranges, purged)
		if err != nil {
			return err
		}
		e.Subjects = subjects[seq]
		if err := fn(e); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read erasures: %w", classify(err))
	}
	return nil
}

// PendingErasures yields every pending erasure mark of the namespace, by
// key and generation; a file made before ns_pending_erasures, read as it
// is, has none.
func (rd *Reader) PendingErasures(ctx context.Context, fn func(*ledger.PendingErase) error) error {
	rows, err := rd.r.QueryContext(ctx, sqlAllPending, rd.args()...)
	if err != nil {
		if noSuchTable(err, "ns_pending_erasures") {
			return nil
		}
		return fmt.Errorf("read pending erasures: %w", classify(err))
	}
	defer func() { _ = rows.Close() }()
	for rows.Next() {
		var p ledger.PendingErase
		var fields int
		if err := rows.Scan(&p.Key, &p.FirstSeq, &p.EraseSeq, &fields, &p.Actor); err != nil {
			return fmt.Errorf("read pending erasures: %w", classify(err))
		}
		p.Fields = chain.FieldSet(fields)
		if err := fn(&p); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read pending erasures: %w", classify(err))
	}
	return nil
}

// PendingErasures yields every pending erasure mark of the namespace.
func (f *lazyChain) PendingErasures(ctx context.Context, fn func(*ledger.PendingErase) error) error {
	return f.rd.PendingErasures(ctx, fn)
}

// PayloadBytes sums the bytes of the values the namespace keeps (salts
// not counted); a file made before ns_payloads, read as it is, keeps none.
func (rd *Reader) PayloadBytes(ctx context.Context) (uint64, error) {
	var n int64
	err := rd.r.QueryRowContext(ctx, sqlPayloadBytes, rd.args()...).Scan(&n)
	switch {
	case noSuchTable(err, "ns_payloads"):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("read payload bytes: %w", classify(err))
	}
	return uint64(max(n, 0)), nil
}

// PayloadBytes sums the bytes of the values the namespace keeps.
func (f *lazyChain) PayloadBytes(ctx context.Context) (uint64, error) {
	return f.rd.PayloadBytes(ctx)
}

// erasureSubjects yields the rows (seq, mac) of query; a file of schema 8
// made before ns_erasure_subjects, read as it is, has none.
func (rd *Reader) erasureSubjects(ctx context.Context, query string, args []any, fn func(uint64, ledger.SubjectMAC)) error {
	rows, err := rd.r.QueryContext(ctx, query, args...)
	if err != nil {
		if noSuchTable(err, "ns_erasure_subjects") {
			return nil
		}
		return fmt.Errorf("read erased subjects: %w", classify(err))
	}
	defer func() { _ = rows.Close() }()
	for rows.Next() {
		var seq uint64
		var mac []byte
		if err := rows.Scan(&seq, &mac); err != nil {
			return fmt.Errorf("read erased subjects: %w", classify(err))
		}
		var m ledger.SubjectMAC
		if len(mac) != len(m) {
			return fmt.Errorf("erasure %d: %w: a subject MAC of %d bytes", seq, ledger.ErrBadErasure, len(mac))
		}
		copy(m[:], mac)
		fn(seq, m)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read erased subjects: %w", classify(err))
	}
	return nil
}

// erasureOf parses a row of ns_erasures.
func erasureOf(seq uint64, salt []byte, ranges string, purged uint64) (*ledger.Erasure, error) {
	e := &ledger.Erasure{Seq: seq, PurgedAt: purged}
	var err error
	if e.Salt, err = chain.SaltFromBytes(salt); err != nil {
		return nil, fmt.Errorf("erasure %d: %w: %w", seq, ledger.ErrBadErasure, err)
	}
	if e.Ranges, err = chain.ParseRanges(ranges); err != nil {
		return nil, fmt.Errorf("erasure %d: %w: %w", seq, ledger.ErrBadErasure, err)
	}
	return e, nil
}

// Erasure reads the opening of the erase receipt at seq, or nil.
func (f *lazyChain) Erasure(ctx context.Context, seq uint64) (*ledger.Erasure, error) {
	return f.rd.Erasure(ctx, seq)
}

// Erasures yields every erasure of the namespace in seq order.
func (f *lazyChain) Erasures(ctx context.Context, fn func(*ledger.Erasure) error) error {
	return f.rd.Erasures(ctx, fn)
}

// PutSubjects indexes a key generation under each subject MAC.
func (t *writeTx) PutSubjects(ctx context.Context, key string, firstSeq uint64, macs []ledger.SubjectMAC) error {
	for _, m := range macs {
		if _, err := t.tx.ExecContext(ctx, `INSERT OR IGNORE INTO ns_subjects (ns, mac, key, first_seq) VALUES (?1, ?2, ?3, ?4)`,
			t.ref.args(m[:], key, firstSeq)...); err != nil {
			return fmt.Errorf("index subjects: %w", classify(err))
		}
	}
	return nil
}

// SubjectGenerations lists the key generations indexed under mac.
func (t *writeTx) SubjectGenerations(ctx context.Context, mac ledger.SubjectMAC) ([]ledger.Generation, error) {
	rows, err := t.tx.QueryContext(ctx, `SELECT key, first_seq FROM ns_subjects WHERE ns = ?1 AND mac = ?2 ORDER BY key, first_seq`,
		t.ref.args(mac[:])...)
	if err != nil {
		return nil, fmt.Errorf("read subjects: %w", classify(err))
	}
	defer func() { _ = rows.Close() }()
	var out []ledger.Generation
	for rows.Next() {
		var g ledger.Generation
		if err := rows.Scan(&g.Key, &g.FirstSeq); err != nil {
			return nil, fmt.Errorf("read subjects: %w", classify(err))
		}
		out = append(out, g)
	}
	return out, classify(rows.Err())
}

// DeleteSubjects deletes the rows of mac and every row of the keys.
func (t *writeTx) DeleteSubjects(ctx context.Context, mac *ledger.SubjectMAC, keys []string) error {
	if mac != nil {
		if _, err := t.tx.ExecContext(ctx, `DELETE FROM ns_subjects WHERE ns = ?1 AND mac = ?2`, t.ref.args(mac[:])...); err != nil {
			return fmt.Errorf("delete subjects: %w", classify(err))
		}
	}
	for _, k := range keys {
		if _, err := t.tx.ExecContext(ctx, `DELETE FROM ns_subjects WHERE ns = ?1 AND key = ?2`, t.ref.args(k)...); err != nil {
			return fmt.Errorf("delete subjects: %w", classify(err))
		}
	}
	return nil
}

// pendingFlag tells whether a chain may have pending erasure marks.
type pendingFlag struct {
	known, may atomic.Bool
}

// PutPending marks a key generation in flight for erasure.
func (t *writeTx) PutPending(ctx context.Context, p *ledger.PendingErase) error {
	t.pending.may.Store(true) // before the write: a rolled-back mark only costs reads
	t.pending.known.Store(true)
	if _, err := t.tx.ExecContext(ctx, `INSERT OR REPLACE INTO ns_pending_erasures (ns, key, first_seq, erase_seq, fields, actor)
		VALUES (?1, ?2, ?3, ?4, ?5, ?6)`, t.ref.args(p.Key, p.FirstSeq, p.EraseSeq, int(p.Fields), p.Actor)...); err != nil {
		return fmt.Errorf("mark pending erasure: %w", classify(err))
	}
	return nil
}

// Pending returns the mark of a key generation, or nil.
func (t *writeTx) Pending(ctx context.Context, key string, firstSeq uint64) (*ledger.PendingErase, error) {
	if !t.pending.known.Load() {
		var any bool
		if err := t.tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM ns_pending_erasures WHERE ns = ?1)`, t.ref.args()...).Scan(&any); err != nil {
			return nil, fmt.Errorf("read pending erasures: %w", classify(err))
		}
		t.pending.may.Store(any)
		t.pending.known.Store(true)
	}
	if !t.pending.may.Load() {
		return nil, nil
	}
	p := &ledger.PendingErase{Key: key, FirstSeq: firstSeq}
	var fields int
	err := t.stmt(ctx, stPending).QueryRowContext(ctx, t.ref.args(key, firstSeq)...).Scan(&p.EraseSeq, &fields, &p.Actor)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("read pending erasure: %w", classify(err))
	}
	p.Fields = chain.FieldSet(fields)
	return p, nil
}

// DeletePending deletes the mark of a key generation.
func (t *writeTx) DeletePending(ctx context.Context, key string, firstSeq uint64) error {
	if _, err := t.tx.ExecContext(ctx, `DELETE FROM ns_pending_erasures WHERE ns = ?1 AND key = ?2 AND first_seq = ?3`,
		t.ref.args(key, firstSeq)...); err != nil {
		return fmt.Errorf("delete pending erasure: %w", classify(err))
	}
	return nil
}

// KeptPayloads lists the receipts after after, up to through, that still
// keep a value, but erase receipts (their reasons stay, SPEC §14). In seq
// order: the receipts index's range, stopped at limit.
func (t *writeTx) KeptPayloads(ctx context.Context, after, through uint64, limit int) ([]ledger.KeptPayload, error) {
	if err := t.flushPayloads(ctx); err != nil {
		return nil, err
	}
	rows, err := t.tx.QueryContext(ctx, `SELECT r.seq, r.kind, r.idempotency_key, p.external_ref IS NOT NULL,
		p.result IS NOT NULL, p.error_message IS NOT NULL, p.note IS NOT NULL
		FROM ns_payloads AS p JOIN ns_receipts AS r ON r.rowid = p.rid
		WHERE r.ns = ?1 AND r.seq > ?2 AND r.seq <= ?3 AND r.kind <> 'erase' AND (p.external_ref IS NOT NULL
			OR p.result IS NOT NULL OR p.error_message IS NOT NULL OR p.note IS NOT NULL)
		ORDER BY r.seq LIMIT ?4`, t.ref.args(after, through, limit)...)
	if err != nil {
		return nil, fmt.Errorf("read kept payloads: %w", classify(err))
	}
	defer func() { _ = rows.Close() }()
	var out []ledger.KeptPayload
	for rows.Next() {
		var kp ledger.KeptPayload
		var has [4]bool
		if err := rows.Scan(&kp.Seq, &kp.Kind, &kp.Key, &has[0], &has[1], &has[2], &has[3]); err != nil {
			return nil, fmt.Errorf("read kept payloads: %w", classify(err))
		}
		for i, f := range chain.PayloadFields {
			if has[i] {
				kp.Fields = kp.Fields.With(f)
			}
		}
		out = append(out, kp)
	}
	return out, classify(rows.Err())
}

// noSuchTable reports whether err is SQLite's refusal of a query of a
// table the file lacks.
func noSuchTable(err error, table string) bool {
	return err != nil && strings.Contains(err.Error(), "no such table: "+table)
}

// payloadTable wraps the error of a query of a payload or erasure table
// that does not exist (a copy of the receipts alone) with
// ledger.ErrNoPayloadTable.
func payloadTable(err error) error {
	if noSuchTable(err, "ns_payloads") || noSuchTable(err, "ns_erasures") {
		return fmt.Errorf("%w: %w", ledger.ErrNoPayloadTable, err)
	}
	return err
}
