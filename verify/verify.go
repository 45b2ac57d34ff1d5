// Package verify audits an effect ledger (SPEC §5): it recomputes the hash
// chain, replays every receipt through the key state machine, checks that
// the chain extends a head pinned earlier, and reports runtime retries,
// re-invocations, duplicate effects, repeated failures, interrupted and
// failed keys and operator resolutions.
//
// A Verifier reads either a ledger database (New) or a server (NewRemote).
// What it reads decides how it checks: a full run of a database reads the
// chain once, in seq order, the key states compact and bounded (seqpass.go);
// an incremental run of a database reads the chain and, beside it, the keys
// it touches in key order (keypass.go); a server's chain is read in seq
// order with every key state in memory (memory.go).
//
// The gate's rules (SPEC §13: approvals, deny, the repeat guard, the
// policy in force) ride on the chain pass of every strategy (gate.go), in
// seq order, so that every strategy reports them alike; an incremental
// run gives the gate the trusted prefix first (gate_prime.go). The key
// states follow a reserve that consumes an approval through the approval
// and its ask to the receipt the reserve stands for (state.go).
package verify

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/mod/sumdb/note"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// Source yields a ledger's receipts in seq order. fn must not retain the
// receipt pointer it is given.
type Source interface {
	Receipts(ctx context.Context, after uint64, fn func(*chain.Receipt) error) error
}

// DB is a ledger database read without its write lock: a namespace of
// either driver (every ledger.Chain is one). Besides the chain it answers
// the queries that bound a check's memory: receipts grouped by key, one
// receipt by seq, the derived keys table and the duplicate and
// repeated-failure groupings; and the values of committed payloads (SPEC
// §14).
type DB = ledger.Audited

// Remote is a ledger served over the API (Server): its chain in seq
// order, one key's receipts at a time for incremental runs, and the
// key_ttl_ms the server lists for the namespace (SPEC §12).
type Remote interface {
	Source
	// KeyHistory yields one key's receipts in seq order.
	KeyHistory(ctx context.Context, key string, fn func(*chain.Receipt) error) error
	KeyTTL(ctx context.Context) (uint64, error)
	// Payloads is the namespace's payload mode (SPEC §14); its receipts
	// carry their values (chain.Receipt.Open) in a committed namespace.
	Payloads(ctx context.Context) (ledger.PayloadMode, error)
	// ListReceipts lists receipts by filter: it tells an incremental run
	// whether the ledger has any policy receipt at all.
	ListReceipts(ctx context.Context, f ledger.ReceiptFilter) ([]chain.Receipt, *uint64, error)
	// SwitchedAt is the seq of the policy receipt that the server lists
	// as having switched the namespace to committed payloads
	// (committed_after), 0 for none.
	SwitchedAt(ctx context.Context) (uint64, error)
	// Pruned is the namespace's pruned prefix (SPEC §16) with the proof
	// of its hash; nil when nothing is pruned.
	Pruned(ctx context.Context) (*ServedPrune, error)
}

// Opts configure a Verifier.
type Opts struct {
	// ExpectHead, if set, must be a receipt of the chain (--expect-head).
	ExpectHead *Pin
	// Pinned is the head of an earlier clean run (--state); the chain must
	// still extend it.
	Pinned *Pin
	// Incremental trusts the receipts up to Pinned and checks only later
	// ones. The pinned receipt is read and rehashed first: if it is gone,
	// carries another hash, or its fields no longer hash to the pin, the
	// run checks the whole chain instead.
	Incremental bool
	// MaxViolations bounds Report.Violations (default 100).
	MaxViolations int
	// Now decides which reservations are interrupted (default time.Now).
	Now func() time.Time
	// Progress, if set, is called with the seq reached every 65,536
	// receipts of the chain pass.
	Progress func(seq uint64)
	// Filter narrows the audit.
	Filter AuditFilter
	// StateBudget bounds the memory of the key states of a full run of a
	// database (bytes; 0: DefaultStateBudget). Keys beyond it are spilled
	// to temporary files and replayed from there: slower, same report.
	StateBudget int
	// Admin reports whether an actor is a token the ledger records as
	// admin, which may reconcile another actor's reserve (SPEC §15). Nil:
	// unknown, and such a reconcile is not reported.
	Admin func(actor string) bool
	// ReceiptsOnly checks a committed namespace whose payload table is
	// missing from the chain alone (--receipts-only), reporting its
	// payloads unchecked instead of payloads_absent (SPEC §14).
	ReceiptsOnly bool
	// Segments, if set, joins the archived segments to the ledger (SPEC
	// §16): each prune receipt's segment, checked whole and against the
	// hashes the ledger keeps (segment_missing, segment_mismatch). A full
	// run of a database only (ErrSegmentsNeedFullRun).
	Segments *Segments
	// Keys, if any, check the signature of the checkpoint that proves the
	// hash a server says its last pruned receipt has (Report.Pruned);
	// without them it is the latest checkpoint the server serves.
	Keys []note.Verifier
}

// Verifier checks one ledger: a database or a server.
type Verifier struct {
	db     DB     // set by New
	remote Remote // set by NewRemote
	src    Source // the one of them that is set
	keyTTL func(context.Context) (uint64, error)
	list   func(context.Context, ledger.ReceiptFilter) ([]chain.Receipt, *uint64, error)
	mode   func(context.Context) (ledger.PayloadMode, error)
	// rows yields the kept values in seq order (a database); nil when the
	// receipts carry them (a server).
	rows func(ctx context.Context, after uint64, fn func(uint64, *chain.Opening) error) error
	// kept reads the chain hashes the ledger keeps, which Opts.Segments
	// joins the segments to (a database).
	kept KeptHashes
	opts Opts
	// keyOrder makes a full run of a database read the key states in key
	// order, as an incremental run does (the tests compare the two).
	keyOrder bool
}

// New returns a Verifier of a ledger database.
func New(db DB, opts Opts) *Verifier {
	return &Verifier{db: db, src: db, keyTTL: db.KeyTTL, list: db.ListReceipts, mode: db.Payloads, rows: db.PayloadRows,
		kept: liveHashes(db), opts: defaults(opts)}
}

// NewRemote returns a Verifier of a ledger served over the API.
func NewRemote(src Remote, opts Opts) *Verifier {
	return &Verifier{remote: src, src: src, keyTTL: src.KeyTTL, list: src.ListReceipts, mode: src.Payloads, opts: defaults(opts)}
}

func defaults(opts Opts) Opts {
	if opts.MaxViolations <= 0 {
		opts.MaxViolations = 100
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.StateBudget <= 0 {
		opts.StateBudget = DefaultStateBudget
	}
	return opts
}

// ErrIncrementalNeedsPin means Incremental was set without Pinned.
var ErrIncrementalNeedsPin = errors.New("incremental verification needs a pinned head (--state)")

// Check runs every check and returns the report. The error is non-nil
// only when the ledger could not be read; broken rules are in the report.
func (v *Verifier) Check(ctx context.Context) (*Report, error) {
	r, err := v.begin(ctx)
	if err != nil {
		return nil, err
	}
	switch {
	case v.remote != nil:
		if err = v.memoryPass(ctx, r); err == nil {
			err = v.checkSwitch(ctx, r)
		}
	case !r.trusted && !v.keyOrder:
		err = v.seqPass(ctx, r)
	default:
		err = v.keyPasses(ctx, r)
	}
	if err == nil && r.tree != nil {
		err = r.tree.finish()
	}
	if err == nil && r.pruned.c != nil {
		r.pruned.checkRows(r.chainCol, &r.cc.pruned, r.from, r.through)
	}
	if err == nil && r.pruned.served != nil {
		r.pruned.checkServedPrune(r.chainCol, &r.cc.pruned)
	}
	if err == nil && v.opts.Segments != nil {
		r.segments, err = v.joinSegments(ctx, r)
		if dirs := r.segmentsCover(v.opts.Segments); err == nil && dirs != nil {
			err = v.joinedPass(ctx, r, dirs)
		}
	}
	r.unverifiedPruned(v.opts)
	if err = errors.Join(err, r.cc.payloads.close(), r.state.err); err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	return r.report(v.opts.MaxViolations), nil
}

// run is the state of one check, shared by the strategies.
type run struct {
	from uint64 // the chain pass starts after from: trusted, or the last deleted body (K)
	// live is where the state checks, the gate and the audit start: after
	// from and after the pruned prefix P (SPEC §16).
	live     uint64
	trusted  bool   // from is an incremental run's pinned head
	through  uint64 // the highest seq the chain pass read: the key states stop there
	ttl, now uint64
	chainCol *collector
	stateCol *collector
	audit    *auditBuilder
	state    *stateChecker
	cc       *chainChecker
	gate     *gateChecker
	dups     []DuplicateEffect
	repeats  []RepeatedFailure
	segments int // joined (Opts.Segments)
	joined   []PrunedRange
	pruned   *pruned
	tree     *keptTree // the kept hashes against the tree (a full run after a deletion)
	// unverified is the range of pruned receipts after the pinned head
	// that this run could not check (Report.UnverifiedPruned).
	unverified []uint64
}

// begin decides what an incremental run may trust and sets up the checks.
func (v *Verifier) begin(ctx context.Context) (*run, error) {
	if v.opts.Incremental && v.opts.Pinned == nil {
		return nil, ErrIncrementalNeedsPin
	}
	if v.opts.Segments != nil && (v.db == nil || v.opts.Incremental) {
		return nil, ErrSegmentsNeedFullRun
	}
	pr, err := v.readPruned(ctx)
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	r := &run{pruned: pr}
	var fromHash chain.Hash
	var fromAt uint64
	if v.opts.Incremental && v.opts.Pinned.Seq > 0 {
		ok, at, err := v.prefixIntact(ctx, pr)
		if err != nil {
			return nil, fmt.Errorf("verify: %w", err)
		}
		if ok {
			r.trusted = true
			r.from, fromAt = v.opts.Pinned.Seq, at
			if fromHash, err = chain.ParseHash(v.opts.Pinned.Hash); err != nil {
				return nil, fmt.Errorf("verify: pinned head: %w", err)
			}
		} // else nothing can be trusted: a full run finds what happened
	}
	if K := pr.mark.Kept; K > 0 && r.from < K {
		// The bodies up to K are deleted: the chain starts at K, from its
		// kept hash; K's recorded_at is gone.
		if fromHash, err = pr.hashAt(ctx, K); err != nil {
			return nil, fmt.Errorf("verify: %w", err)
		}
		r.from, fromAt = K, 0
	}
	r.live = max(r.from, pr.mark.Through)
	if r.ttl, err = v.keyTTL(ctx); err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	r.now = uint64(v.opts.Now().UnixMilli())
	// By seq: the retention sweeps' lists are checked after the chain
	// pass (retention.go).
	r.chainCol = &collector{max: v.opts.MaxViolations, bySeq: true}
	r.stateCol = &collector{max: v.opts.MaxViolations}
	r.audit = newAuditBuilder(v.opts.Filter, r.live)
	r.state = newStateChecker(r.stateCol, r.audit, r.live, r.ttl)
	r.state.admin = v.opts.Admin
	r.cc = newChainChecker(r.chainCol, v.opts, r.from, fromHash, fromAt)
	r.cc.prevAtOK = fromAt > 0 // unknown at K without the segments
	r.cc.prunedThrough = pr.mark.Through
	r.gate = newGateChecker(r.chainCol, r.live, r.ttl, v.opts.Filter)
	r.cc.gate = r.gate
	if err := v.beginPruned(ctx, r); err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	if r.cc.payloads, err = v.payloadChecker(ctx, r.chainCol, r.from); err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	if r.cc.payloads != nil {
		r.cc.payloads.gate = r.gate
	}
	r.state.open = v.opener(ctx, r)
	if err := v.primeGate(ctx, r); err != nil {
		return nil, fmt.Errorf("verify: %w", errors.Join(err, r.cc.payloads.close()))
	}
	return r, nil
}

// report ends the chain checks and builds the report.
func (r *run) report(maxViolations int) *Report {
	r.cc.finish()
	violations := mergeViolations(maxViolations, r.chainCol, r.stateCol)
	audit := r.audit.build(r.dups, r.repeats)
	r.gate.fill(audit, r.now)
	if r.cc.payloads != nil && len(r.cc.payloads.erasures) > 0 {
		audit.Erasures = r.cc.payloads.erasures
	}
	if len(r.cc.pruned.list) > 0 {
		audit.PrunedRanges = r.cc.pruned.list
	}
	return &Report{
		OK:                len(violations) == 0,
		Receipts:          r.cc.count,
		Head:              Pin{Seq: r.cc.lastSeq, Hash: r.cc.prev.String()},
		Violations:        violations,
		ViolationsTotal:   r.chainCol.total + r.stateCol.total,
		Unsupported:       r.chainCol.unsupported + r.stateCol.unsupported,
		Checked:           r.cc.checked,
		PayloadsUnchecked: r.cc.payloads.unchecked(),
		UnverifiedPruned:  r.unverified,
		Pruned:            r.pruned.proof,
		SegmentsJoined:    r.segments,
		Audit:             audit,
	}
}

// errStop ends a scan early.
var errStop = errors.New("stop")

// readReceipt returns the receipt at seq, or nil if the chain has none.
func readReceipt(ctx context.Context, src Source, seq uint64) (*chain.Receipt, error) {
	var got *chain.Receipt
	err := src.Receipts(ctx, seq-1, func(r *chain.Receipt) error {
		if r.Seq == seq {
			c := *r
			got = &c
		}
		return errStop
	})
	if err != nil && !errors.Is(err, errStop) {
		return nil, err
	}
	return got, nil
}

// prefixIntact decides whether an incremental run may trust the receipts
// up to the pinned head: the pinned receipt must still be in the chain,
// carry the pinned hash, and its stored fields must still hash to it
// (given its prev_hash), and an expected head at or below it must be in
// the chain with its hash. Otherwise the run checks the whole chain, so
// that it reports the real length and head and what else changed. It
// returns the pinned receipt's recorded_at, which the first receipt after
// it must not precede.
func (v *Verifier) prefixIntact(ctx context.Context, pr *pruned) (ok bool, pinnedAt uint64, err error) {
	for _, p := range []*Pin{v.opts.Pinned, v.opts.ExpectHead} {
		if p == nil || p.Seq == 0 || p.Seq > v.opts.Pinned.Seq {
			continue
		}
		if pr.any() && p.Seq <= pr.mark.Kept { // its body is gone: its kept hash
			if ok, err := pr.pinIntact(ctx, p); err != nil || !ok {
				return false, 0, err
			}
			continue
		}
		r, err := readReceipt(ctx, v.src, p.Seq)
		if err != nil {
			return false, 0, err
		}
		if r == nil || len(r.Malformed) > 0 || r.Hash.String() != p.Hash {
			return false, 0, nil
		}
		if p == v.opts.Pinned {
			if r.ComputeHash(r.PrevHash) != r.Hash {
				return false, 0, nil
			}
			pinnedAt = r.RecordedAt
		}
	}
	return true, pinnedAt, nil
}
