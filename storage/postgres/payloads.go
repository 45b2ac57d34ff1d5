package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// The values of committed payload fields (SPEC §14) live in the payloads
// table, one row per receipt that has any, written in the same round trip
// as the receipts.

const (
	payloadColumns = `external_ref, external_ref_salt, external_ref_erased, result, result_salt, result_erased,
		error_message, error_message_salt, error_message_erased, note, note_salt, note_erased`
	sqlOpenings       = `SELECT seq, ` + payloadColumns + ` FROM payloads WHERE namespace = $1 AND seq = ANY($2::bigint[])`
	sqlPayloadRows    = `SELECT seq, ` + payloadColumns + ` FROM payloads WHERE namespace = $1 AND seq > $2 ORDER BY seq`
	sqlInsertPayloads = `INSERT INTO payloads (namespace, seq, external_ref, external_ref_salt, result, result_salt,
			error_message, error_message_salt, note, note_salt,
			external_ref_erased, result_erased, error_message_erased, note_erased)
		SELECT unnest($1::text[]), unnest($2::bigint[]), unnest($3::text[]), unnest($4::bytea[]), unnest($5::text[]),
			unnest($6::bytea[]), unnest($7::text[]), unnest($8::bytea[]), unnest($9::text[]), unnest($10::bytea[]),
			unnest($11::bigint[]), unnest($12::bigint[]), unnest($13::bigint[]), unnest($14::bigint[])`
)

// Payloads reads the namespace's payload mode; a schema before version 4,
// read as it is, has none: inline.
func (c *Chain) Payloads(ctx context.Context) (ledger.PayloadMode, error) {
	if c.s.version < 4 {
		return ledger.PayloadsInline, nil
	}
	var mode string
	err := c.s.pool.QueryRow(ctx, `SELECT payloads FROM namespaces WHERE name = $1`, c.ns).Scan(&mode)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("read payload mode: %w: %s", ledger.ErrUnknownNamespace, c.ns)
	}
	if err != nil {
		return "", fmt.Errorf("read payload mode: %w", classify(err))
	}
	return ledger.PayloadMode(mode), nil
}

// Openings reads the openings of the receipts at seqs.
func (c *Chain) Openings(ctx context.Context, seqs []uint64) (map[uint64]*chain.Opening, error) {
	out := map[uint64]*chain.Opening{}
	if c.s.version < 4 || len(seqs) == 0 {
		return out, nil
	}
	err := scanOpenings(ctx, c.s.pool, func(seq uint64, o *chain.Opening) error { out[seq] = o; return nil },
		sqlOpenings, c.ns, seqArgs(seqs))
	return out, err
}

// PayloadRows yields the openings after seq in seq order.
func (c *Chain) PayloadRows(ctx context.Context, after uint64, fn func(uint64, *chain.Opening) error) error {
	if c.s.version < 4 {
		return nil
	}
	return scanOpenings(ctx, c.s.pool, fn, sqlPayloadRows, c.ns, int64(after))
}

// Openings reads the openings of the receipts at seqs, this transaction's
// appends included.
func (t *tx) Openings(ctx context.Context, seqs []uint64) (map[uint64]*chain.Opening, error) {
	out := map[uint64]*chain.Opening{}
	var stored []uint64
	for _, seq := range seqs {
		if _, ok := t.bySeq[seq]; ok {
			if o := t.openings[seq]; o != nil {
				out[seq] = o
			}
			continue
		}
		stored = append(stored, seq)
	}
	if len(stored) == 0 {
		return out, nil
	}
	err := scanOpenings(ctx, t.conn, func(seq uint64, o *chain.Opening) error {
		for f, by := range t.erasedStored[seq] {
			if p := o.Get(f); p != nil && p.ErasedBy == 0 {
				o.Set(f, &chain.Payload{ErasedBy: by})
			}
		}
		out[seq] = o
		return nil
	}, sqlOpenings, t.c.ns, seqArgs(stored))
	if err != nil {
		return nil, t.dbFail("read payloads", err)
	}
	return out, nil
}

func seqArgs(seqs []uint64) []int64 {
	out := make([]int64, len(seqs))
	for i, s := range seqs {
		out[i] = int64(s)
	}
	return out
}

type rowQuerier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// scanOpenings runs query and yields each row (seq, then payloadColumns).
func scanOpenings(ctx context.Context, q rowQuerier, fn func(uint64, *chain.Opening) error, query string, args ...any) error {
	rows, err := q.Query(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("read payloads: %w", payloadTable(classify(err)))
	}
	defer rows.Close()
	for rows.Next() {
		var seq int64
		var vals [4]*string
		var salts [4][]byte
		var erased [4]int64
		dest := []any{&seq}
		for i := range vals {
			dest = append(dest, &vals[i], &salts[i], &erased[i])
		}
		if err := rows.Scan(dest...); err != nil {
			return fmt.Errorf("read payloads: %w", classify(err))
		}
		var o chain.Opening
		for i, f := range chain.PayloadFields {
			switch {
			case vals[i] != nil:
				s, err := chain.SaltFromBytes(salts[i])
				if err != nil {
					return fmt.Errorf("read payloads of receipt %d: %s: %w", seq, f.Name(), err)
				}
				o.Set(f, &chain.Payload{Value: *vals[i], Salt: s})
			case erased[i] > 0:
				o.Set(f, &chain.Payload{ErasedBy: uint64(erased[i])})
			}
		}
		if err := fn(uint64(seq), &o); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read payloads: %w", classify(err))
	}
	return nil
}

// payloadRows are the payload rows of a write, one array per column.
type payloadRows struct {
	ns     []string
	seq    []int64
	vals   [4][]*string
	salts  [4][][]byte
	erased [4][]int64 // erased in the transaction that appended them (a pending erasure)
}

// add appends the openings of namespace ns's receipts appended in t.
func (p *payloadRows) add(ns string, t *tx) {
	for _, r := range t.receipts {
		o := t.openings[r.Seq]
		if o.Empty() {
			continue
		}
		p.ns, p.seq = append(p.ns, ns), append(p.seq, int64(r.Seq))
		for i, f := range chain.PayloadFields {
			var erased int64
			if v := o.Get(f); v != nil && v.ErasedBy == 0 {
				val := v.Value
				p.vals[i], p.salts[i] = append(p.vals[i], &val), append(p.salts[i], v.Salt[:])
			} else {
				p.vals[i], p.salts[i] = append(p.vals[i], nil), append(p.salts[i], nil)
				if v != nil {
					erased = int64(v.ErasedBy)
				}
			}
			p.erased[i] = append(p.erased[i], erased)
		}
	}
}

func (p *payloadRows) args() []any {
	return []any{p.ns, p.seq, p.vals[0], p.salts[0], p.vals[1], p.salts[1], p.vals[2], p.salts[2], p.vals[3], p.salts[3],
		p.erased[0], p.erased[1], p.erased[2], p.erased[3]}
}

// eraseOp is an erasure buffered by a transaction: the receipts' fields to
// erase, and the opening of its set.
type eraseOp struct {
	seq    uint64
	fields map[uint64]chain.FieldSet
}

// ErasePayloads buffers the erasure of the given fields of each receipt;
// the write sends it after the batch's payload rows. The values appended
// in this transaction are erased in its buffer too.
func (t *tx) ErasePayloads(_ context.Context, eraseSeq uint64, fields map[uint64]chain.FieldSet) error {
	t.erases = append(t.erases, eraseOp{seq: eraseSeq, fields: fields})
	for seq, set := range fields {
		if _, appended := t.bySeq[seq]; !appended {
			if t.erasedStored == nil {
				t.erasedStored = map[uint64]map[chain.PayloadField]uint64{}
			}
			m := t.erasedStored[seq]
			if m == nil {
				m = map[chain.PayloadField]uint64{}
				t.erasedStored[seq] = m
			}
			for _, f := range chain.PayloadFields {
				if _, done := m[f]; set.Has(f) && !done {
					m[f] = eraseSeq
				}
			}
			continue
		}
		if o := t.openings[seq]; o != nil {
			c := *o
			for _, f := range chain.PayloadFields {
				if set.Has(f) && c.Get(f) != nil {
					c.Set(f, &chain.Payload{ErasedBy: eraseSeq})
				}
			}
			t.openings[seq] = &c
		}
	}
	return nil
}

// PutErasure buffers the opening of an erase receipt's set.
func (t *tx) PutErasure(_ context.Context, e *ledger.Erasure) error {
	t.erasures = append(t.erasures, *e)
	return nil
}

// queueErases adds the erasures of ts to b: per field, one UPDATE of the
// receipts listed, and the erasures' rows.
func queueErases(b *pgx.Batch, ns string, t *tx) {
	for _, op := range t.erases {
		for _, f := range chain.PayloadFields {
			var seqs []int64
			for seq, set := range op.fields {
				if set.Has(f) {
					seqs = append(seqs, int64(seq))
				}
			}
			if len(seqs) == 0 {
				continue
			}
			col := f.Name()
			b.Queue(`UPDATE payloads SET `+col+` = NULL, `+col+`_salt = NULL, `+col+`_erased = $3
				WHERE namespace = $1 AND seq = ANY($2::bigint[]) AND `+col+` IS NOT NULL`, ns, seqs, int64(op.seq))
		}
	}
	for _, e := range t.erasures {
		b.Queue(`INSERT INTO erasures (namespace, seq, salt, ranges) VALUES ($1, $2, $3, $4)`,
			ns, int64(e.Seq), e.Salt[:], chain.RangesText(e.Ranges))
		for _, m := range e.Subjects {
			b.Queue(`INSERT INTO erasure_subjects (namespace, seq, mac) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`,
				ns, int64(e.Seq), m[:])
		}
	}
}

// Erasure reads the opening of the erase receipt at seq, or nil.
func (c *Chain) Erasure(ctx context.Context, seq uint64) (*ledger.Erasure, error) {
	var out *ledger.Erasure
	err := c.erasures(ctx, `WHERE namespace = $1 AND seq = $2`, []any{c.ns, int64(seq)}, func(e *ledger.Erasure) error {
		out = e
		return nil
	})
	return out, err
}

// Erasures yields every erasure of the namespace in seq order.
func (c *Chain) Erasures(ctx context.Context, fn func(*ledger.Erasure) error) error {
	return c.erasures(ctx, `WHERE namespace = $1`, []any{c.ns}, fn)
}

// PendingErasures yields every pending erasure mark of the namespace, by
// key and generation; a database made before pending_erasures, read as it
// is, has none.
func (c *Chain) PendingErasures(ctx context.Context, fn func(*ledger.PendingErase) error) error {
	if c.s.version < 4 {
		return nil
	}
	rows, err := c.s.pool.Query(ctx, `SELECT idempotency_key, first_seq, erase_seq, fields, actor FROM pending_erasures
		WHERE namespace = $1 ORDER BY idempotency_key, first_seq`, c.ns)
	var out []ledger.PendingErase
	if err == nil {
		var p ledger.PendingErase
		var first, eraseSeq int64
		var fields int16
		_, err = pgx.ForEachRow(rows, []any{&p.Key, &first, &eraseSeq, &fields, &p.Actor}, func() error {
			p.FirstSeq, p.EraseSeq, p.Fields = uint64(first), uint64(eraseSeq), chain.FieldSet(fields)
			out = append(out, p)
			return nil
		})
	}
	if err != nil && !isCode(err, codeUndefinedTable) {
		return fmt.Errorf("read pending erasures: %w", classify(err))
	}
	for i := range out {
		if err := fn(&out[i]); err != nil {
			return err
		}
	}
	return nil
}

// PayloadBytes sums the bytes of the values the namespace keeps (salts
// not counted); a schema before version 4, read as it is, keeps none.
func (c *Chain) PayloadBytes(ctx context.Context) (uint64, error) {
	if c.s.version < 4 {
		return 0, nil
	}
	var n int64
	err := c.s.pool.QueryRow(ctx, `SELECT coalesce(sum(coalesce(octet_length(external_ref), 0)
		+ coalesce(octet_length(result), 0) + coalesce(octet_length(error_message), 0)
		+ coalesce(octet_length(note), 0)), 0)::bigint FROM payloads WHERE namespace = $1`, c.ns).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("read payload bytes: %w", classify(err))
	}
	return uint64(max(n, 0)), nil
}

// erasures yields the erasures that where selects, in seq order, each
// with its subjects (none in a database made before erasure_subjects,
// read as it is).
func (c *Chain) erasures(ctx context.Context, where string, args []any, fn func(*ledger.Erasure) error) error {
	if c.s.version < 4 {
		return nil
	}
	subjects := map[int64][]ledger.SubjectMAC{}
	rows, err := c.s.pool.Query(ctx, `SELECT seq, mac FROM erasure_subjects `+where+` ORDER BY seq, mac`, args...)
	if err == nil {
		var seq int64
		var mac []byte
		_, err = pgx.ForEachRow(rows, []any{&seq, &mac}, func() error {
			var m ledger.SubjectMAC
			if len(mac) != len(m) {
				return fmt.Errorf("erasure %d: %w: a subject MAC of %d bytes", seq, ledger.ErrBadErasure, len(mac))
			}
			copy(m[:], mac)
			subjects[seq] = append(subjects[seq], m)
			return nil
		})
	}
	if err != nil && !isCode(err, codeUndefinedTable) {
		return fmt.Errorf("read erased subjects: %w", classify(err))
	}
	var out []*ledger.Erasure
	rows, err = c.s.pool.Query(ctx, `SELECT seq, salt, ranges FROM erasures `+where+` ORDER BY seq`, args...)
	if err == nil {
		var seq int64
		var salt []byte
		var ranges string
		_, err = pgx.ForEachRow(rows, []any{&seq, &salt, &ranges}, func() error {
			e := &ledger.Erasure{Seq: uint64(seq), Subjects: subjects[seq]}
			var err error
			if e.Salt, err = chain.SaltFromBytes(salt); err != nil {
				return fmt.Errorf("erasure %d: %w: %w", seq, ledger.ErrBadErasure, err)
			}
			if e.Ranges, err = chain.ParseRanges(ranges); err != nil {
				return fmt.Errorf("erasure %d: %w: %w", seq, ledger.ErrBadErasure, err)
			}
			out = append(out, e)
			return nil
		})
	}
	if err != nil {
		return fmt.Errorf("read erasures: %w", payloadTable(classify(err)))
	}
	for _, e := range out {
		if err := fn(e); err != nil {
			return err
		}
	}
	return nil
}

// PutSubjects buffers the index of a key generation under each subject MAC.
func (t *tx) PutSubjects(_ context.Context, key string, firstSeq uint64, macs []ledger.SubjectMAC) error {
	for _, m := range macs {
		t.subjectOps = append(t.subjectOps, subjectOp{mac: m, key: key, firstSeq: firstSeq})
	}
	return nil
}

// SubjectGenerations lists the key generations indexed under mac: the
// stored rows, then this transaction's.
func (t *tx) SubjectGenerations(ctx context.Context, mac ledger.SubjectMAC) ([]ledger.Generation, error) {
	rows, err := t.conn.Query(ctx, `SELECT idempotency_key, first_seq FROM subjects WHERE namespace = $1 AND mac = $2
		ORDER BY idempotency_key, first_seq`, t.c.ns, mac[:])
	if err != nil {
		return nil, t.dbFail("read subjects", err)
	}
	var out []ledger.Generation
	for rows.Next() {
		var g ledger.Generation
		var first int64
		if err := rows.Scan(&g.Key, &first); err != nil {
			rows.Close()
			return nil, t.dbFail("read subjects", err)
		}
		g.FirstSeq = uint64(first)
		out = append(out, g)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, t.dbFail("read subjects", err)
	}
	for _, op := range t.subjectOps {
		if !op.del && op.mac == mac {
			out = append(out, ledger.Generation{Key: op.key, FirstSeq: op.firstSeq})
		}
	}
	return out, nil
}

// DeleteSubjects buffers the deletion of the rows of mac and of the keys.
func (t *tx) DeleteSubjects(_ context.Context, mac *ledger.SubjectMAC, keys []string) error {
	if mac != nil {
		t.subjectOps = append(t.subjectOps, subjectOp{del: true, mac: *mac, byMAC: true})
	}
	for _, k := range keys {
		t.subjectOps = append(t.subjectOps, subjectOp{del: true, key: k})
	}
	return nil
}

// subjectOp is a buffered change of the subject index.
type subjectOp struct {
	del      bool
	byMAC    bool // a deletion by mac (else by key)
	mac      ledger.SubjectMAC
	key      string
	firstSeq uint64
}

// queueSubjects adds t's changes of the subject index to b, in order.
func queueSubjects(b *pgx.Batch, ns string, t *tx) {
	for _, op := range t.subjectOps {
		switch {
		case !op.del:
			b.Queue(`INSERT INTO subjects (namespace, mac, idempotency_key, first_seq) VALUES ($1, $2, $3, $4)
				ON CONFLICT DO NOTHING`, ns, op.mac[:], op.key, int64(op.firstSeq))
		case op.byMAC:
			b.Queue(`DELETE FROM subjects WHERE namespace = $1 AND mac = $2`, ns, op.mac[:])
		default:
			b.Queue(`DELETE FROM subjects WHERE namespace = $1 AND idempotency_key = $2`, ns, op.key)
		}
	}
}

// PutPending buffers a mark of a key generation in flight for erasure.
func (t *tx) PutPending(_ context.Context, p *ledger.PendingErase) error {
	if t.pending == nil {
		t.pending = map[ledger.Generation]*ledger.PendingErase{}
	}
	c := *p
	t.pending[ledger.Generation{Key: p.Key, FirstSeq: p.FirstSeq}] = &c
	return nil
}

// Pending returns the mark of a key generation: this transaction's, else
// the stored one.
func (t *tx) Pending(ctx context.Context, key string, firstSeq uint64) (*ledger.PendingErase, error) {
	if p, ok := t.pending[ledger.Generation{Key: key, FirstSeq: firstSeq}]; ok {
		return p, nil // nil: deleted in this transaction
	}
	p := &ledger.PendingErase{Key: key, FirstSeq: firstSeq}
	var eraseSeq int64
	var fields int16
	err := t.conn.QueryRow(ctx, `SELECT erase_seq, fields, actor FROM pending_erasures
		WHERE namespace = $1 AND idempotency_key = $2 AND first_seq = $3`, t.c.ns, key, int64(firstSeq)).Scan(&eraseSeq, &fields, &p.Actor)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, t.dbFail("read pending erasure", err)
	}
	p.EraseSeq, p.Fields = uint64(eraseSeq), chain.FieldSet(fields)
	return p, nil
}

// DeletePending buffers the deletion of a key generation's mark.
func (t *tx) DeletePending(_ context.Context, key string, firstSeq uint64) error {
	if t.pending == nil {
		t.pending = map[ledger.Generation]*ledger.PendingErase{}
	}
	t.pending[ledger.Generation{Key: key, FirstSeq: firstSeq}] = nil
	return nil
}

// queuePending adds t's marks (and their deletions) to b.
func queuePending(b *pgx.Batch, ns string, t *tx) {
	for g, p := range t.pending {
		b.Queue(`DELETE FROM pending_erasures WHERE namespace = $1 AND idempotency_key = $2 AND first_seq = $3`,
			ns, g.Key, int64(g.FirstSeq))
		if p != nil {
			b.Queue(`INSERT INTO pending_erasures (namespace, idempotency_key, first_seq, erase_seq, fields, actor)
				VALUES ($1, $2, $3, $4, $5, $6)`, ns, p.Key, int64(p.FirstSeq), int64(p.EraseSeq), int16(p.Fields), p.Actor)
		}
	}
}

// KeptPayloads lists the stored receipts after after, up to through, that still keep a
// value, but erase receipts (a sweep's own transaction appends none before it reads). A
// row whose values an erase of this batch took comes with no fields: the caller pages on
// past it.
func (t *tx) KeptPayloads(ctx context.Context, after, through uint64, limit int) ([]ledger.KeptPayload, error) {
	rows, err := t.conn.Query(ctx, `SELECT p.seq, r.kind, r.idempotency_key, p.external_ref IS NOT NULL,
		p.result IS NOT NULL, p.error_message IS NOT NULL, p.note IS NOT NULL
		FROM payloads AS p JOIN receipts AS r ON r.namespace = p.namespace AND r.seq = p.seq
		WHERE p.namespace = $1 AND p.seq > $2 AND p.seq <= $3 AND r.kind <> 'erase' AND (p.external_ref IS NOT NULL
			OR p.result IS NOT NULL OR p.error_message IS NOT NULL OR p.note IS NOT NULL)
		ORDER BY p.seq LIMIT $4`, t.c.ns, int64(after), int64(through), limit)
	if err != nil {
		return nil, t.dbFail("read kept payloads", err)
	}
	defer rows.Close()
	var out []ledger.KeptPayload
	for rows.Next() {
		var kp ledger.KeptPayload
		var seq int64
		var has [4]bool
		if err := rows.Scan(&seq, &kp.Kind, &kp.Key, &has[0], &has[1], &has[2], &has[3]); err != nil {
			return nil, t.dbFail("read kept payloads", err)
		}
		kp.Seq = uint64(seq)
		for i, f := range chain.PayloadFields {
			if _, erased := t.erasedStored[kp.Seq][f]; has[i] && !erased { // not by an erase of this batch
				kp.Fields = kp.Fields.With(f)
			}
		}
		out = append(out, kp) // Fields 0: all erased in this batch, still a step of the page
	}
	if err := rows.Err(); err != nil {
		return nil, t.dbFail("read kept payloads", err)
	}
	return out, nil
}
