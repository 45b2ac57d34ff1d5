package ledger

import (
	"context"
	"errors"
	"fmt"

	"github.com/effect-ledger/effect-ledger/chain"
)

// Payloads that can be erased (SPEC §14). A namespace's payload mode is
// fixed when it is created: inline (the values in the receipts, as before
// v1.4) or committed (the four payload fields hold salted commitments, and
// the values with their salts live beside the chain, where they can be
// deleted). The domain makes the commitments (batchTx.append) and attaches
// the values to the copies of receipts it answers with (the opening):
// drivers store and read rows, caches keep the chain form.

// PayloadMode is how a namespace keeps its payload fields.
type PayloadMode string

// The payload modes.
const (
	PayloadsInline    PayloadMode = "inline"
	PayloadsCommitted PayloadMode = "committed"
)

// ParsePayloadMode returns the mode named s; "" is def.
func ParsePayloadMode(s string, def PayloadMode) (PayloadMode, error) {
	switch m := PayloadMode(s); m {
	case "":
		return def, nil
	case PayloadsInline, PayloadsCommitted:
		return m, nil
	}
	return "", Invalid("payloads", "payloads must be %q or %q", PayloadsInline, PayloadsCommitted)
}

// DefaultPayloads is the payload mode of a namespace created without one,
// and of the default namespace of a new ledger (SPEC §14: committed, so
// that what an effect carries can be erased; ledgerd --default-payloads
// and the namespace's settings choose inline instead).
const DefaultPayloads = PayloadsCommitted

// NamespaceSettings are fixed when a namespace is created.
type NamespaceSettings struct {
	// KeyTTL: keys expire this many ms after their outcome (SPEC §12; 0:
	// never).
	KeyTTL uint64
	// Payloads is the payload mode (SPEC §14).
	Payloads PayloadMode
}

// Resolved returns s with an empty payload mode replaced by
// DefaultPayloads.
func (s NamespaceSettings) Resolved() NamespaceSettings {
	if s.Payloads == "" {
		s.Payloads = DefaultPayloads
	}
	return s
}

// ErrUnsupported: the storage holds something this build does not know (a
// payload mode, a kind); a verifier exits 2 on it, never 1.
var ErrUnsupported = errors.New("unsupported")

// PayloadReader reads the values kept beside a chain (SPEC §14) without
// its head lock.
type PayloadReader interface {
	// Payloads is the namespace's payload mode, stored when it was created.
	// A mode the driver does not know is returned as it is stored.
	Payloads(ctx context.Context) (PayloadMode, error)
	// Openings returns the openings of the receipts at seqs that have
	// values kept (receipts without any are left out).
	Openings(ctx context.Context, seqs []uint64) (map[uint64]*chain.Opening, error)
	// PayloadRows yields the openings of the receipts after seq that have
	// one, in seq order.
	PayloadRows(ctx context.Context, after uint64, fn func(seq uint64, o *chain.Opening) error) error
	// Erasure returns the opening of the erase receipt at seq, or nil.
	Erasure(ctx context.Context, seq uint64) (*Erasure, error)
	// Erasures yields the opening of every erase receipt in seq order.
	Erasures(ctx context.Context, fn func(*Erasure) error) error
	// PendingErasures yields every pending erasure mark, by key and
	// generation.
	PendingErasures(ctx context.Context, fn func(*PendingErase) error) error
	// PayloadBytes is the sum of the lengths in bytes of the values the
	// namespace still keeps beside its chain (the four payload fields of
	// its committed receipts; salts not counted, erased values gone): 0
	// for an inline namespace or a database without a payload table.
	PayloadBytes(ctx context.Context) (uint64, error)
}

// PayloadTx is what a batch writes beside a committed chain (SPEC §14):
// erasures and the subject index. A batch that erases nothing and names no
// subject calls none of it.
type PayloadTx interface {
	// ErasePayloads deletes the kept values (and salts) of the fields of
	// each receipt (seq → fields), this transaction's appends included,
	// marking them erased by the erase receipt at eraseSeq.
	ErasePayloads(ctx context.Context, eraseSeq uint64, fields map[uint64]chain.FieldSet) error
	// PutErasure stores the opening of an erase receipt's set: its
	// ranges and salt, never erased.
	PutErasure(ctx context.Context, e *Erasure) error
	// PutSubjects indexes the generation of key that starts at firstSeq
	// under each subject's MAC.
	PutSubjects(ctx context.Context, key string, firstSeq uint64, macs []SubjectMAC) error
	// SubjectGenerations lists the key generations indexed under mac.
	SubjectGenerations(ctx context.Context, mac SubjectMAC) ([]Generation, error)
	// DeleteSubjects deletes the rows of mac (when not nil) and every row
	// of the keys.
	DeleteSubjects(ctx context.Context, mac *SubjectMAC, keys []string) error
	// PutPending marks a key generation still in flight for erasure.
	PutPending(ctx context.Context, p *PendingErase) error
	// Pending returns the mark of a key generation, or nil; this
	// transaction's marks included.
	Pending(ctx context.Context, key string, firstSeq uint64) (*PendingErase, error)
	// DeletePending deletes the mark of a key generation.
	DeletePending(ctx context.Context, key string, firstSeq uint64) error
	// KeptPayloads lists, in seq order, up to limit receipts with
	// after < seq ≤ through that still keep a value, erase receipts
	// aside (their reasons are never erased), with the fields that do;
	// a driver may list one whose values this transaction erased with
	// no fields.
	KeptPayloads(ctx context.Context, after, through uint64, limit int) ([]KeptPayload, error)
}

// KeptPayload is a receipt that still keeps values: its seq, kind and key,
// and which fields.
type KeptPayload struct {
	Seq    uint64
	Kind   string
	Key    string
	Fields chain.FieldSet
}

// PendingErase marks a key generation that an erase selected while it was
// still in flight (reserved or interrupted): the receipt that finalizes it
// is followed, in its transaction, by an erase covering it (SPEC §14).
type PendingErase struct {
	Key      string
	FirstSeq uint64
	EraseSeq uint64 // the erase that marked it; 0: an erase that erased nothing
	Fields   chain.FieldSet
	Actor    string
}

// SubjectMAC is a subject as the ledger keeps it: HMAC-SHA-256 of the
// subject under the namespace's fingerprint key. The subject itself is
// never stored, logged or put on the chain.
type SubjectMAC [32]byte

// Generation is a generation of a key: the key and the seq of the reserve
// that started it.
type Generation struct {
	Key      string
	FirstSeq uint64
}

// ErrNoPayloadTable: the database has no table of payload values (a copy
// of the receipts alone); a verifier reports payloads_absent (SPEC §14).
var ErrNoPayloadTable = errors.New("the ledger has no payload table")

// ErrBadErasure: a stored erasure whose salt or ranges do not parse (an
// edited table); the verifier reports it as erase_invalid.
var ErrBadErasure = errors.New("the erasure's stored opening does not parse")

// Erasure is the opening of an erase receipt's set (SPEC §14): the
// erased ranges of seqs and the salt; SetDigest(Salt, Ranges) is the
// receipt's set. Kept beside the chain, never erased; readable by admins
// and the verifier.
type Erasure struct {
	Seq    uint64
	Salt   chain.Salt
	Ranges []chain.Range
	// PurgedAt is when the files were rid of the erased values (unix ms;
	// 0: not yet; SQLite only).
	PurgedAt uint64
	// Subjects are the MACs of the subjects an erase by subject was asked
	// for, kept so that a backup restored from before it loses their
	// index rows too (ErasureExport, ReplayErasures).
	Subjects []SubjectMAC
}

// Audited is what the verifier reads of a namespace (verify.DB): the
// chain's queries and the values kept beside it.
type Audited interface {
	AuditReader
	PayloadReader
	PrunedLog
}

// committed reports whether the namespace was created committed: all its
// receipts are.
func (n *Namespace) committed() bool { return n.payloads == PayloadsCommitted }

// Payloads is the namespace's payload mode in force as last known: the
// mode it was created with, or committed once it knows of a switch
// (PayloadsNow reads the chain again).
func (n *Namespace) Payloads() PayloadMode {
	if n.knownSwitch() > 0 {
		return PayloadsCommitted
	}
	return n.payloads
}

// shown attaches their openings to receipts read from the chain, for an
// answer: each value is checked against its commitment first (a value that
// does not open it is an integrity error, as a changed receipt is). The
// receipts are copies: they never go back to a cache.
func (n *Namespace) shown(ctx context.Context, rs []chain.Receipt,
	read func(context.Context, []uint64) (map[uint64]*chain.Opening, error)) error {
	from, ok := uint64(0), n.committed()
	if !ok && anyCommitment(rs) { // the receipts after a switch, if any
		at, err := n.PayloadSwitch(ctx)
		if err != nil {
			return err
		}
		from, ok = at, at > 0
	}
	return n.open(ctx, rs, from, ok, read)
}

// open attaches their openings to the receipts of rs after from (when ok:
// the committed part), as shown does.
func (n *Namespace) open(ctx context.Context, rs []chain.Receipt, from uint64, ok bool,
	read func(context.Context, []uint64) (map[uint64]*chain.Opening, error)) error {
	if !ok {
		return nil
	}
	seq, fault, err := openReceipts(ctx, rs, from, read)
	if fault != nil {
		return n.payloadTampered(ctx, seq, fault.Field)
	}
	return err
}

// ShowPayloads attaches to receipts read from c (copies, never a cache's)
// the values their payload fields commit to, as the API shows them, for
// the tools that read a database directly. A value that does not open
// its commitment is an *Error with ECodeIntegrityError. Receipts of an
// inline namespace, or of the inline part of a switched one, are left as
// they are.
func ShowPayloads(ctx context.Context, c ShownReader, rs []chain.Receipt) error {
	if len(rs) == 0 {
		return nil
	}
	from, ok, err := committedFrom(ctx, c, rs)
	if err != nil || !ok {
		return err
	}
	seq, fault, err := openReceipts(ctx, rs, from, c.Openings)
	if fault != nil {
		return &Error{Code: ECodeIntegrityError,
			Message: fmt.Sprintf("the %s of receipt %d does not match the commitment the chain recorded for it; `ledgerctl verify` shows what changed", fault.Field.Name(), seq),
			Details: map[string]any{"seq": seq, "field": fault.Field.Name()}}
	}
	return err
}

// ShownReader is what ShowPayloads reads: the values, the payload mode and
// the policy receipts (where a switch is).
type ShownReader interface {
	PayloadReader
	PolicyLister
}

// openReceipts attaches the openings read to the receipts of rs after
// from; the first value that does not open its commitment is returned
// with its seq, and nothing more is attached.
func openReceipts(ctx context.Context, rs []chain.Receipt, from uint64,
	read func(context.Context, []uint64) (map[uint64]*chain.Opening, error)) (uint64, *chain.PayloadFault, error) {
	seqs := make([]uint64, 0, len(rs))
	for i := range rs {
		if rs[i].Seq > from && hasCommitment(&rs[i]) {
			seqs = append(seqs, rs[i].Seq)
		}
	}
	if len(seqs) == 0 {
		return 0, nil, nil
	}
	open, err := read(ctx, seqs)
	if err != nil {
		return 0, nil, fmt.Errorf("read payloads: %w", err)
	}
	for i := range rs {
		r := &rs[i]
		if r.Seq <= from {
			continue // the inline part of a switched namespace
		}
		o := open[r.Seq]
		if o == nil {
			if hasCommitment(r) {
				r.Open = new(chain.Opening) // every value missing: shown as the chain text
			}
			continue
		}
		if faults := o.Check(r); len(faults) > 0 {
			return r.Seq, &faults[0], nil
		}
		r.Open = o
	}
	return 0, nil, nil
}

// hasCommitment reports whether a payload field of r holds a commitment.
func hasCommitment(r *chain.Receipt) bool {
	for _, f := range chain.PayloadFields {
		if !chain.Exempt(r.Kind, f) && chain.IsCommitment(r.Field(f)) {
			return true
		}
	}
	return false
}

// shownOne is shown for one receipt read in a batch's transaction.
func (t *batchTx) shown(ctx context.Context, r *chain.Receipt) error {
	rs := []chain.Receipt{*r}
	from, ok, err := t.committedFrom(ctx)
	if err != nil {
		return err
	}
	if err := t.n.open(ctx, rs, from, ok, t.Openings); err != nil {
		return err
	}
	*r = rs[0]
	return nil
}

// GetReceipt reads the receipt at seq, with its values.
func (n *Namespace) GetReceipt(ctx context.Context, seq uint64) (*chain.Receipt, error) {
	r, err := n.chain.GetReceipt(ctx, seq)
	if err != nil || r == nil {
		return r, err
	}
	c := *r
	rs := []chain.Receipt{c}
	if err := n.shown(ctx, rs, n.chain.Openings); err != nil {
		return nil, err
	}
	return &rs[0], nil
}

// ListReceipts lists receipts by filter, with their values.
func (n *Namespace) ListReceipts(ctx context.Context, f ReceiptFilter) ([]chain.Receipt, *uint64, error) {
	rs, next, err := n.chain.ListReceipts(ctx, f)
	if err != nil {
		return nil, nil, err
	}
	rs = append([]chain.Receipt(nil), rs...)
	if err := n.shown(ctx, rs, n.chain.Openings); err != nil {
		return nil, nil, err
	}
	return rs, next, nil
}

// payloadTampered is the integrity_error of a kept value that does not
// open its receipt's commitment: logged without the value, counted, and
// the ledger stops reporting ready.
func (n *Namespace) payloadTampered(ctx context.Context, seq uint64, f chain.PayloadField) error {
	n.l.logger.ErrorContext(ctx, "stored value does not match its commitment on the chain; it is not served",
		"namespace", n.name, "seq", seq, "field", f.Name())
	integrityErrors.WithLabelValues(n.name).Inc()
	refusal := &Error{Code: ECodeIntegrityError,
		Message: fmt.Sprintf("the %s of receipt %d of namespace %s does not match the commitment the chain recorded for it, so it is not served; `ledgerctl verify` shows what changed", f.Name(), seq, n.name),
		Details: map[string]any{"seq": seq, "field": f.Name()}}
	n.l.Fault(refusal)
	return refusal
}
