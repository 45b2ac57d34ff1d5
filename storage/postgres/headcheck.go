package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// A namespace's head row is what every write locks and compare-and-sets:
// without it nothing can be appended, and a head row that is not the
// chain's last receipt means receipts were removed (or added) outside
// ledgerd. Both are refused as damaged storage (ledger.ErrStorageCorrupt:
// 503 storage_corrupt, nothing recorded, never a fork from seq 0, and
// /readyz 503 from then on), stop ledgerd at start, and are reported by
// the verifier as derived_state (the head row is state kept beside the
// receipts, as the SQLite file's recorded head is).

// sqlHeadGuard refuses DELETE and TRUNCATE of head rows: a namespace's
// head is never removed by the ledger. A superuser can still bypass it
// (session_replication_role, ALTER TABLE … DISABLE TRIGGER), which the
// checks below catch.
const sqlHeadGuard = `
CREATE OR REPLACE FUNCTION ledger_head_kept() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	RAISE EXCEPTION 'the head rows of the ledger are never removed (% refused)', TG_OP
		USING ERRCODE = 'restrict_violation';
END $$;
CREATE OR REPLACE TRIGGER head_kept BEFORE DELETE ON head
	FOR EACH ROW EXECUTE FUNCTION ledger_head_kept();
CREATE OR REPLACE TRIGGER head_no_truncate BEFORE TRUNCATE ON head
	FOR EACH STATEMENT EXECUTE FUNCTION ledger_head_kept();`

// ensureHeadGuard installs sqlHeadGuard where it is missing (a database
// made by an earlier build), under migrate's advisory lock.
func ensureHeadGuard(ctx context.Context, tx pgx.Tx) error {
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_trigger WHERE tgname = 'head_kept' AND tgrelid = 'head'::regclass`).Scan(&n); err != nil {
		return fmt.Errorf("head guard: %w", err)
	}
	if n == 1 {
		return nil
	}
	if _, err := tx.Exec(ctx, sqlHeadGuard); err != nil {
		return fmt.Errorf("head guard: %w", err)
	}
	return nil
}

// sqlHeadAndTail reads, in one statement (one snapshot), a namespace's
// head row (NULLs when it is missing) and its last receipt (NULLs when
// it has none); no row when the namespace does not exist.
const sqlHeadAndTail = `SELECT h.seq, h.hash, t.seq, t.hash FROM namespaces AS n
	LEFT JOIN head AS h ON h.namespace = n.name
	LEFT JOIN LATERAL (SELECT seq, hash FROM receipts WHERE namespace = n.name ORDER BY seq DESC LIMIT 1) AS t ON true
	WHERE n.name = $1`

// sqlHeadsOff names the first namespace whose head row is missing or is
// not its last receipt, with the same columns.
const sqlHeadsOff = `SELECT n.name, h.seq, h.hash, t.seq, t.hash FROM namespaces AS n
	LEFT JOIN head AS h ON h.namespace = n.name
	LEFT JOIN LATERAL (SELECT seq, hash FROM receipts WHERE namespace = n.name ORDER BY seq DESC LIMIT 1) AS t ON true
	WHERE h.namespace IS NULL OR h.seq != coalesce(t.seq, 0) OR (t.seq IS NOT NULL AND h.hash != t.hash)
	ORDER BY n.name LIMIT 1`

// headTail is a namespace's head row and last receipt as sqlHeadAndTail
// reads them.
type headTail struct {
	headSeq, tailSeq   *int64
	headHash, tailHash []byte
}

func (ht *headTail) dest() []any {
	return []any{&ht.headSeq, &ht.headHash, &ht.tailSeq, &ht.tailHash}
}

// check returns nil when the head row is the chain's last receipt (or 0
// with no receipts), else the error that names what is wrong with ns.
func (ht *headTail) check(ns string) error {
	var tail ledger.Head
	if ht.tailSeq != nil {
		tail.Seq = uint64(*ht.tailSeq)
		tail.Hash, _ = chain.HashFromBytes(ht.tailHash)
	}
	if ht.headSeq == nil {
		return &lostHead{ns: ns, what: fmt.Sprintf("its head row is missing while its chain holds %d receipts", tail.Seq)}
	}
	head := ledger.Head{Seq: uint64(*ht.headSeq)}
	head.Hash, _ = chain.HashFromBytes(ht.headHash)
	if head == tail {
		return nil
	}
	return &lostHead{ns: ns, what: fmt.Sprintf("its head row is %d (%s) but its receipts end at %d (%s): receipts were changed, removed or added, or the head row was",
		head.Seq, shortHash(head.Hash), tail.Seq, shortHash(tail.Hash))}
}

// lostHead is a namespace whose head row is missing or is not its last
// receipt: damaged storage (ledger.ErrStorageCorrupt: 503, nothing
// recorded) whose derived state does not match its chain
// (ledger.ErrDerivedState: the verifier's derived_state).
type lostHead struct {
	ns, what string
	err      error // the database's refusal that showed it, if any
}

func (e *lostHead) Error() string {
	return fmt.Sprintf("namespace %s: %s (outside ledgerd); nothing is written to it: "+
		"check the chain with `ledgerctl verify --namespace %s`, then restore the head row from a backup", e.ns, e.what, e.ns)
}

func (e *lostHead) Unwrap() []error {
	errs := []error{ledger.ErrStorageCorrupt, ledger.ErrDerivedState}
	if e.err != nil {
		errs = append(errs, e.err)
	}
	return errs
}

// headBehind turns the refusal of a batch that appended a receipt whose
// seq is already stored — its head row was set back or made again
// outside ledgerd — into a lostHead of the batch's namespaces (name).
func headBehind(err error, name string) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != codeUniqueViolation || pe.ConstraintName != "receipts_pkey" {
		return err
	}
	return &lostHead{ns: name, what: "its head row is behind its receipts (" + pe.Message + ")", err: err}
}

func shortHash(h chain.Hash) string { return h.String()[:12] }

// checkHead compares the namespace's head row with its last receipt.
func (c *Chain) checkHead(ctx context.Context) error {
	var ht headTail
	err := c.s.pool.QueryRow(ctx, sqlHeadAndTail, c.ns).Scan(ht.dest()...)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: %s", ledger.ErrUnknownNamespace, c.ns)
	}
	if err != nil {
		return fmt.Errorf("read head: %w", classify(err))
	}
	return ht.check(c.ns)
}

// checkHeads is checkHead for every namespace at once (one statement),
// run when a writable Store opens, so that a tampered namespace stops
// ledgerd at start, as the SQLite driver does.
func checkHeads(ctx context.Context, conn *pgx.Conn) error {
	var ns string
	var ht headTail
	err := conn.QueryRow(ctx, sqlHeadsOff).Scan(append([]any{&ns}, ht.dest()...)...)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("check the namespaces' heads: %w", err)
	}
	return ht.check(ns)
}
