package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// SQL of the reads and the probe a run makes on its connection.
const (
	sqlTxKey = `SELECT key_generated, tool, effect, input_hash, idempotent, first_seq, reserve_seq,
		lease_expires_at, final_seq, token_hash FROM keys WHERE namespace = $1 AND idempotency_key = $2`

	// The gate's receipts (SPEC §2.1) do not count for the attempt rule.
	sqlTxMaxAttempt = `SELECT max(attempt) FROM receipts
		WHERE namespace = $1 AND execution_id = $2 AND idempotency_key = $3 AND seq >= $4
		AND kind IN ('reserve', 'commit', 'replay', 'resolve', 'reconcile')`

	sqlTxLastSeq = `SELECT max(seq) FROM receipts WHERE namespace = $1 AND idempotency_key = $2`

	sqlProbe = `INSERT INTO ready_probe (namespace, probed_at) VALUES ($1, $2)
		ON CONFLICT (namespace) DO UPDATE SET probed_at = EXCLUDED.probed_at`
)

// tx is one namespace's part of one run of a Write: the head as locked, the reads made on the
// transaction's connection, and the writes buffered until write.
type tx struct {
	c            *Chain
	conn         *pgx.Conn
	pid          uint32
	backendStart time.Time
	now          uint64

	oldHead       ledger.Head
	oldRecordedAt uint64
	head          ledger.Head
	policySeq     uint64           // the latest policy receipt's seq, this transaction's appends included
	pruned        ledger.PruneMark // the pruned prefix, read with the head; this transaction's prune included
	prunes        []ledger.Prune   // prune rows to insert (PutPrune)
	dbErr         error            // the first failed database call

	receipts []chain.Receipt           // in the chain form (Open nil)
	openings map[uint64]*chain.Opening // the values of the appended committed receipts (SPEC §14)
	erases   []eraseOp                 // sent after the payload rows
	// erasedStored are the fields of stored receipts that this batch's
	// erases took (seq → field → erase seq): reads in the batch apply
	// them, since the UPDATEs go out at COMMIT.
	erasedStored map[uint64]map[chain.PayloadField]uint64
	erasures     []ledger.Erasure                           // the erase receipts\' openings
	subjectOps   []subjectOp                                // the subject index\'s changes, sent in order
	pending      map[ledger.Generation]*ledger.PendingErase // pending erasure marks (nil: deleted)
	reconciled   []reconciledToken                          // tokens of reconciled reservations (SPEC §15)
	bySeq        map[uint64]int                             // index into receipts
	keys         map[string]*ledger.KeyRecord
	keyOrder     []string
	loaded       map[string]*ledger.KeyRecord // read with the head (begin): nil value = no such key
	loadedRcpt   map[uint64]chain.Receipt
	hashFrom     int64
	hashes       []tlog.Hash
	checkpoint   *tlog.Signed
	probed       bool
	ended        []string
	askInputs    []askInputOp // sent in order by write
	purgeBefore  uint64       // write deletes the asked inputs whose delete_after is before it
}

func (t *tx) dirty() bool {
	return len(t.receipts) > 0 || len(t.keys) > 0 || t.checkpoint != nil || t.probed || len(t.askInputs) > 0 ||
		len(t.erases) > 0 || len(t.subjectOps) > 0 || len(t.pending) > 0 || len(t.reconciled) > 0 || len(t.prunes) > 0
}

// dbFail records the first failed database call and classifies it.
func (t *tx) dbFail(what string, err error) error {
	if t.dbErr == nil {
		t.dbErr = err
	}
	return fmt.Errorf("%s: %w", what, classify(err))
}

// Locked returns the head as locked (this transaction's appends
// included), the batch's time, the latest policy receipt's seq and the
// pruned prefix (this transaction's prune included).
func (t *tx) Locked(context.Context) (ledger.Locked, error) {
	return ledger.Locked{Head: t.head, Now: t.now, PolicySeq: t.policySeq, Pruned: t.pruned}, nil
}

// Key returns the record of key, this transaction's writes included.
func (t *tx) Key(ctx context.Context, key string) (ledger.KeyRecord, bool, error) {
	if k, ok := t.keys[key]; ok {
		return *k, true, nil
	}
	if k, ok := t.loaded[key]; ok {
		if k == nil {
			return ledger.KeyRecord{Key: key}, false, nil
		}
		return *k, true, nil
	}
	k := ledger.KeyRecord{Key: key}
	var token []byte
	err := scanKey(t.conn.QueryRow(ctx, sqlTxKey, t.c.ns, key), &k, false, &token)
	if errors.Is(err, pgx.ErrNoRows) {
		return k, false, nil
	}
	if err != nil {
		return k, false, t.dbFail("read key", err)
	}
	k.TokenHash = string(token)
	return k, true, nil
}

// Receipt returns the receipt at seq, this transaction's appends included.
func (t *tx) Receipt(ctx context.Context, seq uint64) (chain.Receipt, error) {
	if i, ok := t.bySeq[seq]; ok {
		return t.receipts[i], nil
	}
	if r, ok := t.loadedRcpt[seq]; ok {
		return r, nil
	}
	rows, err := t.conn.Query(ctx, sqlReceiptBySeq, t.c.ns, int64(seq))
	if err != nil {
		return chain.Receipt{}, t.dbFail(fmt.Sprintf("read receipt %d", seq), err)
	}
	rs, err := collectReceipts(rows)
	if err != nil {
		return chain.Receipt{}, t.dbFail(fmt.Sprintf("read receipt %d", seq), err)
	}
	if len(rs) == 0 {
		return chain.Receipt{}, fmt.Errorf("read receipt %d: %w", seq, pgx.ErrNoRows)
	}
	return rs[0], nil
}

// sqlPreloadGroupKeys reads the records of the keys of a write's batches,
// by (namespace, key), sent with the head locks (begin), and
// sqlPreloadGroupReceipts the receipts their decisions read (the latest
// reserve, the latest outcome and the receipt after it, whose prev_hash
// the outcome is checked against). Each looks its rows up one by one in a
// LATERAL subquery (LIMIT 1 keeps it from being flattened into a join):
// "= ANY($2)" in a cached generic plan can turn into a sequential scan
// that compares every row with every key (seen on a young table: a
// 256-key batch took 3× longer with it than with a round trip per key).
const (
	sqlPreloadGroupKeys = `SELECT u.ns, k.* FROM unnest($1::text[], $2::text[]) AS u(ns, key), LATERAL (
		SELECT idempotency_key, key_generated, tool, effect, input_hash, idempotent, first_seq,
			reserve_seq, lease_expires_at, final_seq, token_hash FROM keys
		WHERE namespace = u.ns AND idempotency_key = u.key LIMIT 1) AS k`
	sqlPreloadGroupReceipts = `SELECT u.ns, r.* FROM unnest($1::text[], $2::text[]) AS u(ns, key), LATERAL (
		SELECT reserve_seq, final_seq FROM keys WHERE namespace = u.ns AND idempotency_key = u.key LIMIT 1) AS k,
		LATERAL (SELECT ` + receiptColumns + ` FROM receipts
			WHERE namespace = u.ns AND seq IN (k.reserve_seq, k.final_seq,
				CASE WHEN k.final_seq > 0 THEN k.final_seq + 1 END) LIMIT 3) AS r`
)

// prefixed is a row whose first column (the namespace of a group's
// preload) goes to first, the rest to the scan's destinations.
type prefixed struct {
	pgx.Row
	first any
}

func (p prefixed) Scan(dest ...any) error { return p.Row.Scan(append([]any{p.first}, dest...)...) }

// preloaded records that keys were read: found or not.
func (t *tx) preloaded(keys []string) {
	if t.loaded == nil {
		t.loaded = make(map[string]*ledger.KeyRecord, len(keys))
	}
	for _, k := range keys {
		if _, ok := t.loaded[k]; !ok {
			t.loaded[k] = nil
		}
	}
}

// LastSeq returns the seq of key's latest receipt, this transaction's
// appends included.
func (t *tx) LastSeq(ctx context.Context, key string) (uint64, error) {
	for i := len(t.receipts) - 1; i >= 0; i-- {
		if t.receipts[i].IdempotencyKey == key {
			return t.receipts[i].Seq, nil
		}
	}
	var m *int64
	if err := t.conn.QueryRow(ctx, sqlTxLastSeq, t.c.ns, key).Scan(&m); err != nil {
		return 0, t.dbFail("read last receipt of key", err)
	}
	if m == nil {
		return 0, fmt.Errorf("read last receipt of key: key %q has no receipt", key)
	}
	return uint64(*m), nil
}

// MaxAttempt returns the highest attempt recorded for execution on key
// from seq since on, this transaction's appends included.
func (t *tx) MaxAttempt(ctx context.Context, key, execution string, since uint64) (uint64, bool, error) {
	var m *int64
	if err := t.conn.QueryRow(ctx, sqlTxMaxAttempt, t.c.ns, execution, key, int64(since)).Scan(&m); err != nil {
		return 0, false, t.dbFail("read attempts", err)
	}
	var out uint64
	found := m != nil
	if found {
		out = uint64(*m)
	}
	for i := range t.receipts {
		r := &t.receipts[i]
		if r.IdempotencyKey == key && r.ExecutionID == execution && r.Seq >= since && ledger.CountsForAttempts(r.Kind) &&
			(!found || r.Attempt > out) {
			out, found = r.Attempt, true
		}
	}
	return out, found, nil
}

// Append buffers r, which must extend Head(), with its leaf's stored tree
// hashes.
func (t *tx) Append(ctx context.Context, r *chain.Receipt, treeHashes []tlog.Hash) error {
	if r.Seq != t.head.Seq+1 || r.PrevHash != t.head.Hash {
		return fmt.Errorf("append receipt %d: it does not extend the head (%d)", r.Seq, t.head.Seq)
	}
	if field, ok := nulField(r); ok || (r.Open != nil && nulValue(r.Open)) {
		if !ok {
			field = "a payload field"
		}
		// PostgreSQL text cannot hold NUL; refuse here rather than fail
		// the whole batch at COMMIT time.
		return &ledger.Error{Code: ledger.ECodeInvalidRequest,
			Message: field + " must not contain a NUL character", Details: map[string]any{"field": field}}
	}
	n := tlog.LeafIndex(r.Seq)
	base := sumdb.StoredHashIndex(0, n)
	if len(t.hashes) == 0 {
		t.hashFrom = base
	} else if base != t.hashFrom+int64(len(t.hashes)) {
		return fmt.Errorf("append receipt %d: its tree hashes start at %d, want %d", r.Seq, base, t.hashFrom+int64(len(t.hashes)))
	}
	if want := sumdb.StoredHashCount(n+1) - sumdb.StoredHashCount(n); int64(len(treeHashes)) != want {
		return fmt.Errorf("append receipt %d: %d tree hashes, want %d", r.Seq, len(treeHashes), want)
	}
	if t.bySeq == nil {
		t.bySeq = map[uint64]int{}
	}
	t.bySeq[r.Seq] = len(t.receipts)
	c := *r
	if !c.Open.Empty() {
		if t.openings == nil {
			t.openings = map[uint64]*chain.Opening{}
		}
		t.openings[r.Seq] = c.Open
	}
	c.Open = nil
	t.receipts = append(t.receipts, c)
	t.hashes = append(t.hashes, treeHashes...)
	t.head = ledger.Head{Seq: r.Seq, Hash: r.Hash}
	switch r.Kind {
	case chain.KindCommit, chain.KindResolve, chain.KindReconcile, chain.KindApproval:
		// An approval ends a wait too: a reserve waiting for the answer
		// to its ask (SPEC §13, wait_ms).
		t.ended = append(t.ended, r.IdempotencyKey)
	case chain.KindPolicy:
		t.policySeq = r.Seq
	}
	return nil
}

// nulField names the first string field of r holding a NUL byte.
func nulField(r *chain.Receipt) (string, bool) {
	for _, f := range []struct{ name, v string }{
		{"kind", r.Kind}, {"idempotency_key", r.IdempotencyKey}, {"execution_id", r.ExecutionID},
		{"tool", r.Tool}, {"effect", r.Effect}, {"input_hash", r.InputHash}, {"outcome", r.Outcome},
		{"external_ref", r.ExternalRef}, {"result", r.Result}, {"error_code", r.ErrorCode},
		{"error_message", r.ErrorMessage}, {"actor", r.Actor}, {"note", r.Note},
	} {
		if strings.IndexByte(f.v, 0) >= 0 {
			return f.name, true
		}
	}
	return "", false
}

// nulValue reports whether a value of o holds a NUL byte.
func nulValue(o *chain.Opening) bool {
	for _, f := range chain.PayloadFields {
		if p := o.Get(f); p != nil && strings.IndexByte(p.Value, 0) >= 0 {
			return true
		}
	}
	return false
}

// PutKey buffers an insert or replacement of a key record.
func (t *tx) PutKey(ctx context.Context, k *ledger.KeyRecord) error {
	if t.keys == nil {
		t.keys = map[string]*ledger.KeyRecord{}
	}
	if _, ok := t.keys[k.Key]; !ok {
		t.keyOrder = append(t.keyOrder, k.Key)
	}
	c := *k
	t.keys[k.Key] = &c
	return nil
}

// ReadHashes reads stored tree hashes: this transaction's, the cache's,
// then the table's.
func (t *tx) ReadHashes(ctx context.Context, idx []int64) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(idx))
	var missing []int64
	tc := t.c.s.treeCache(t.c.ns)
	for i, x := range idx {
		if x >= t.hashFrom && x < t.hashFrom+int64(len(t.hashes)) && len(t.hashes) > 0 {
			out[i] = t.hashes[x-t.hashFrom]
			continue
		}
		if h, ok := tc.get(x); ok {
			out[i] = h
			continue
		}
		missing = append(missing, x)
	}
	if len(missing) == 0 {
		return out, nil
	}
	got, err := readHashes(ctx, t.conn, t.c.ns, missing)
	if err != nil {
		if t.dbErr == nil && !strings.Contains(err.Error(), "not stored") {
			t.dbErr = err
		}
		return nil, err
	}
	tc.fill(out, idx, got)
	return out, nil
}

// PutCheckpoint buffers a signed checkpoint, setting c.SignedAt to Now();
// ledger.ErrStaleCheckpoint unless c is larger than every stored one.
func (t *tx) PutCheckpoint(ctx context.Context, c *tlog.Signed) error {
	if c.Size < 1 || uint64(c.Size) > t.head.Seq {
		return fmt.Errorf("store checkpoint: size %d is beyond the chain (%d)", c.Size, t.head.Seq)
	}
	var last int64
	if err := t.conn.QueryRow(ctx, `SELECT coalesce(max(size), 0) FROM checkpoints WHERE namespace = $1`,
		t.c.ns).Scan(&last); err != nil {
		return t.dbFail("store checkpoint", err)
	}
	if t.checkpoint != nil {
		last = max(last, t.checkpoint.Size)
	}
	if c.Size <= last {
		return fmt.Errorf("store checkpoint: size %d, stored %d: %w", c.Size, last, ledger.ErrStaleCheckpoint)
	}
	c.SignedAt = t.now
	cp := *c
	t.checkpoint = &cp
	return nil
}

// Probe writes one small row outside the chain in this transaction.
func (t *tx) Probe(ctx context.Context) error {
	if _, err := t.conn.Exec(ctx, sqlProbe, t.c.ns, int64(t.now)); err != nil {
		return t.dbFail("probe", err)
	}
	t.probed = true
	return nil
}
