// Package verify audits an effect ledger (SPEC §5): it recomputes the hash
// chain, replays every receipt through the key state machine, checks that
// the chain extends a head pinned earlier, and reports runtime retries,
// re-invocations, duplicate effects, repeated failures, interrupted and
// failed keys and operator resolutions.
package verify

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// Source yields a ledger's receipts in seq order. fn must not retain the
// receipt pointer it is given.
type Source interface {
	Receipts(ctx context.Context, after uint64, fn func(*chain.Receipt) error) error
}

// KeySource is a Source that can also yield the receipts of every key that
// has a receipt after a seq, grouped by key and in seq order within a key.
// With it the state checks hold one key in memory at a time.
type KeySource interface {
	Source
	KeyReceipts(ctx context.Context, after uint64, fn func(*chain.Receipt) error) error
}

// KeyHistorySource is a Source that can yield one key's receipts in seq
// order. Incremental runs on a plain Source use it for the keys touched
// after the pinned head.
type KeyHistorySource interface {
	Source
	KeyHistory(ctx context.Context, key string, fn func(*chain.Receipt) error) error
}

// KeyTTLSource is a Source that knows the ledger's key_ttl_ms (SPEC §12),
// stored with the ledger: a file or database, or a server that lists it.
type KeyTTLSource interface {
	Source
	KeyTTL(ctx context.Context) (uint64, error)
}

// Rules a violation can name (SPEC §5). RuleDerivedState is reported when a
// derived table disagrees with the receipts; RuleInvalidField when a field
// holds a value no ledger writes.
const (
	RuleGenesis              = "genesis"
	RuleSeqGap               = "seq_gap"
	RuleBrokenLink           = "broken_link"
	RuleHashMismatch         = "hash_mismatch"
	RuleCommitWithoutReserve = "commit_without_reserve"
	RuleDoubleFinalization   = "double_finalization"
	RuleReserveAfterSuccess  = "reserve_after_success"
	RuleRetryNotAllowed      = "retry_not_allowed"
	RuleReplayWithoutSuccess = "replay_without_success"
	RuleAttemptOrder         = "attempt_order"
	RuleFingerprintChanged   = "fingerprint_changed"
	RuleHeadMismatch         = "head_mismatch"
	RuleDerivedState         = "derived_state"
	RuleInvalidField         = "invalid_field"
)

// Pin is a verified head: the chain must keep the receipt at Seq with Hash.
type Pin struct {
	Seq  uint64 `json:"seq"`
	Hash string `json:"hash"`
}

// Violation is one broken rule.
type Violation struct {
	Seq    uint64 `json:"seq"`
	Rule   string `json:"rule"`
	Detail string `json:"detail"`
}

// Report is the result of a check, in the JSON form of SPEC §5.
type Report struct {
	OK       bool   `json:"ok"`
	Receipts uint64 `json:"receipts"`
	Head     Pin    `json:"head"`
	// Violations holds the first Opts.MaxViolations; ViolationsTotal
	// counts them all.
	Violations      []Violation `json:"violations"`
	ViolationsTotal int         `json:"violations_total"`
	// Checked is how many receipts were rehashed (fewer than Receipts on
	// an incremental run).
	Checked uint64 `json:"checked"`
	Audit   *Audit `json:"audit"`
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
	// KeyTTL is the key_ttl_ms the key state rules apply (SPEC §12) when
	// the source is not a KeyTTLSource; a KeyTTLSource's own wins.
	KeyTTL uint64
	// StateBudget bounds the memory of the key states of a full run over a
	// SeqSource (bytes; 0: DefaultStateBudget). Keys beyond it are spilled
	// to temporary files and replayed from there: slower, same report.
	StateBudget int
}

// Verifier checks one Source.
type Verifier struct {
	src  Source
	opts Opts
}

// New returns a Verifier of src.
func New(src Source, opts Opts) *Verifier {
	if opts.MaxViolations <= 0 {
		opts.MaxViolations = 100
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.StateBudget <= 0 {
		opts.StateBudget = DefaultStateBudget
	}
	return &Verifier{src: src, opts: opts}
}

// ErrIncrementalNeedsPin means Incremental was set without Pinned.
var ErrIncrementalNeedsPin = errors.New("incremental verification needs a pinned head (--state)")

// Check runs every check and returns the report. The error is non-nil
// only when the source could not be read; broken rules are in the report.
//
// A full run of a SeqSource (the SQLite file, PostgreSQL) reads the chain
// once, in seq order: the chain checks and the key states share the pass,
// the key states compact and bounded by Opts.StateBudget (see single.go).
// Any other run of a KeySource (an incremental one) reads the chain in seq
// order and, concurrently, the receipts of the keys it touches in key
// order, one key in memory at a time. Otherwise the state checks ride on
// the chain pass and hold every key in memory.
func (v *Verifier) Check(ctx context.Context) (*Report, error) {
	if v.opts.Incremental && v.opts.Pinned == nil {
		return nil, ErrIncrementalNeedsPin
	}
	var from uint64 // receipts up to from are trusted
	var fromHash chain.Hash
	if v.opts.Incremental && v.opts.Pinned.Seq > 0 {
		ok, err := v.prefixIntact(ctx)
		if err != nil {
			return nil, fmt.Errorf("verify: %w", err)
		}
		if ok {
			from = v.opts.Pinned.Seq
			if fromHash, err = chain.ParseHash(v.opts.Pinned.Hash); err != nil {
				return nil, fmt.Errorf("verify: pinned head: %w", err)
			}
		} // else nothing can be trusted: a full run finds what happened
	}
	ttl := v.opts.KeyTTL
	if ts, ok := v.src.(KeyTTLSource); ok {
		var err error
		if ttl, err = ts.KeyTTL(ctx); err != nil {
			return nil, fmt.Errorf("verify: %w", err)
		}
	}
	now := uint64(v.opts.Now().UnixMilli())
	chainCol := &collector{max: v.opts.MaxViolations}
	stateCol := &collector{max: v.opts.MaxViolations}
	audit := newAuditBuilder(v.opts.Filter, from)
	state := newStateChecker(stateCol, audit, from, ttl)
	cc := newChainChecker(chainCol, v.opts, from, fromHash)

	var dups []DuplicateEffect
	var repeats []RepeatedFailure
	// Without a RepeatSource, repeated failures are found in the seq-ordered
	// chain pass; on an incremental run that pass starts at the pinned head,
	// so only failures among the receipts read are seen.
	finder := newRepeatFinder()
	if ks, ok := v.src.(KeySource); ok {
		ds, dupSource := v.src.(DuplicateSource)
		if dupSource {
			audit.dups = nil // found by the source, in constant memory
		}
		rs, repeatSource := v.src.(RepeatSource)
		if repeatSource {
			finder = nil
		}
		// A full run of a SeqSource replays the keys in the chain pass; any
		// other run reads them grouped by key, concurrently.
		ss, single := v.src.(SeqSource)
		single = single && from == 0
		var sp *singlePass
		var top *level
		if single {
			stateCol.bySeq = true
			// The single pass checks the keys table itself (level.keyRow);
			// the driftChecker only collects and re-checks its suspects.
			sp = &singlePass{ctx: ctx, src: ss, state: state, drift: &driftChecker{col: stateCol, src: ss},
				budget: v.opts.StateBudget, now: now}
			defer sp.cleanup()
			var hint uint64 // at most one key per receipt: the head's seq
			switch hs := v.src.(type) {
			case interface {
				Head(context.Context) (ledger.Head, error)
			}:
				if h, err := hs.Head(ctx); err == nil {
					hint = h.Seq
				}
			case interface {
				ReadHead(context.Context) (ledger.Head, error)
			}:
				if h, err := hs.ReadHead(ctx); err == nil {
					hint = h.Seq
				}
			}
			sp.hint = hint
			var err error
			if top, err = sp.newLevel(0, hint); err != nil {
				return nil, fmt.Errorf("verify: %w", err)
			}
			level0 := top
			defer func() {
				if level0.table != nil {
					level0.table.release()
				}
			}()
		}
		statePass := make(chan error, 1)
		if !single {
			go func() { statePass <- v.keyPass(ctx, ks, state, stateCol, from, now) }()
		}
		// A single pass notes each success's (tool, input_hash): when no two
		// share one, which is the usual case, the duplicate query is not
		// run at all.
		var succ *successSet
		if single && dupSource && sp.hint > 0 {
			succ = newSuccessSet(sp, sp.hint)
		}
		// The grouping queries run one after the other on one connection,
		// beside the pass(es).
		// A single pass also watches for a failure the repeated-failures
		// query could start from: the query starts at the first one, and
		// does not run when the pass ends without one.
		var fails *failureGate
		if single && repeatSource {
			fails = newFailureGate()
		}
		queryPass := make(chan error, 1)
		go func() {
			var errD, errR error
			if dupSource && succ == nil {
				dups, errD = readDuplicates(ctx, ds, v.opts.Filter, from)
			}
			if repeatSource && errD == nil && fails.wait() {
				repeats, errR = readRepeats(ctx, rs, v.opts.Filter, from)
			}
			queryPass <- errors.Join(errD, errR)
		}()
		// In a single pass the chain checks and then the key states run on
		// goroutines of their own, batches behind the reading.
		var spErr error
		var replay *batcher
		chainStep := func(r *chain.Receipt) {
			cc.add(r)
			if finder != nil {
				finder.add(r)
			}
			if succ != nil {
				succ.add(r)
			}
			if fails != nil {
				fails.see(r)
			}
		}
		if top != nil {
			replay = newBatcher(chainStep, func(r *chain.Receipt) {
				if top == nil || spErr != nil {
					return
				}
				if len(r.Malformed) > 0 {
					// Re-reading by seq needs well-formed rows: the state
					// checks of an edited file take the key-ordered pass.
					top = nil
					return
				}
				e := eventOf(r)
				spErr = top.add(&e, r)
			})
		}
		err := v.src.Receipts(ctx, from, func(r *chain.Receipt) error {
			if replay != nil {
				replay.add(r)
			} else {
				chainStep(r)
			}
			return nil
		})
		if replay != nil {
			replay.close()
		}
		fails.passDone()
		// The successes noted are compared (sorted, partition files read
		// back) beside the key states' work after the pass.
		dupPass := make(chan error, 1)
		if succ != nil && err == nil {
			go func() {
				var errD error
				if succ.mayRepeat() {
					dups, errD = readDuplicates(ctx, ds, v.opts.Filter, from)
				}
				dupPass <- errD
			}()
		} else {
			dupPass <- nil
		}
		if single {
			switch {
			case err != nil:
			case spErr != nil:
				err = spErr
			case top != nil:
				err = top.finish(func(fn func(*ledger.KeyRecord) error) error { return ss.Keys(ctx, fn) })
				if err == nil {
					err = sp.drift.finish(ctx)
				}
			default:
				stateCol = &collector{max: v.opts.MaxViolations}
				dupsOff := audit.dups == nil
				audit = newAuditBuilder(v.opts.Filter, from)
				if dupsOff {
					audit.dups = nil
				}
				state = newStateChecker(stateCol, audit, from, ttl)
				err = v.keyPass(ctx, ks, state, stateCol, from, now)
			}
			statePass <- nil
		}
		err = errors.Join(err, <-statePass, <-queryPass, <-dupPass)
		if err != nil {
			return nil, fmt.Errorf("verify: %w", err)
		}
	} else {
		var touched map[string]struct{}
		if from > 0 {
			touched = map[string]struct{}{}
		}
		if err := v.src.Receipts(ctx, from, func(r *chain.Receipt) error {
			cc.add(r)
			if touched != nil {
				touched[r.IdempotencyKey] = struct{}{}
			} else {
				state.add(r)
				finder.add(r)
			}
			return nil
		}); err != nil {
			return nil, fmt.Errorf("verify: %w", err)
		}
		if touched != nil {
			hs, ok := v.src.(KeyHistorySource)
			if !ok {
				return nil, errors.New("verify: this source cannot load key histories for an incremental run")
			}
			// The touched keys' histories come key by key: the finder
			// gets what matters to it sorted by seq. It sees the failures
			// of touched keys only, so an incremental online run misses a
			// repeat of a call that failed under an older, untouched key.
			var forFinder []chain.Receipt
			for key := range touched {
				if err := hs.KeyHistory(ctx, key, func(r *chain.Receipt) error {
					state.add(r)
					if finder.wanted(r) {
						forFinder = append(forFinder, *r)
					}
					return nil
				}); err != nil {
					return nil, fmt.Errorf("verify: %w", err)
				}
				state.flush(key, now)
			}
			finder.addUnordered(forFinder)
		}
		state.finish(now)
	}
	if finder != nil {
		repeats = finder.list(v.opts.Filter, from)
	}
	cc.finish()

	violations := mergeViolations(v.opts.MaxViolations, chainCol, stateCol)
	return &Report{
		OK:              len(violations) == 0,
		Receipts:        cc.count,
		Head:            Pin{Seq: cc.lastSeq, Hash: cc.prev.String()},
		Violations:      violations,
		ViolationsTotal: chainCol.total + stateCol.total,
		Checked:         cc.checked,
		Audit:           audit.build(dups, repeats),
	}, nil
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
// that it reports the real length and head and what else changed.
func (v *Verifier) prefixIntact(ctx context.Context) (bool, error) {
	for _, p := range []*Pin{v.opts.Pinned, v.opts.ExpectHead} {
		if p == nil || p.Seq == 0 || p.Seq > v.opts.Pinned.Seq {
			continue
		}
		r, err := readReceipt(ctx, v.src, p.Seq)
		if err != nil {
			return false, err
		}
		if r == nil || len(r.Malformed) > 0 || r.Hash.String() != p.Hash {
			return false, nil
		}
		if p == v.opts.Pinned && r.ComputeHash(r.PrevHash) != r.Hash {
			return false, nil
		}
	}
	return true, nil
}

// keyPass runs the state checks in key order, and on full runs of a
// DerivedSource cross-checks the keys table against the replayed state.
func (v *Verifier) keyPass(ctx context.Context, ks KeySource, state *stateChecker, col *collector, from, now uint64) error {
	if ds, ok := ks.(DerivedSource); ok && from == 0 {
		state.drift = newDriftChecker(ctx, col, ds)
	}
	err := ks.KeyReceipts(ctx, from, func(r *chain.Receipt) error {
		state.addGrouped(r, now)
		return nil
	})
	state.finish(now)
	if state.drift != nil {
		if derr := state.drift.finish(ctx); err == nil {
			err = derr
		}
	}
	return err
}

// mergeViolations orders the violations of both passes by seq and keeps
// the first max.
func mergeViolations(max int, cols ...*collector) []Violation {
	out := []Violation{}
	for _, c := range cols {
		out = append(out, c.list...)
	}
	slices.SortStableFunc(out, func(a, b Violation) int { return cmp.Compare(a.Seq, b.Seq) })
	if len(out) > max {
		out = out[:max]
	}
	return out
}

// collector keeps the first max violations and counts them all. With
// bySeq set, violations may come in any seq order (the key states of a
// single pass replayed from spill files come after later receipts): it
// keeps the max with the lowest seq, in the order found among equal seqs.
type collector struct {
	max   int
	list  []Violation
	total int
	bySeq bool
}

func (c *collector) add(seq uint64, rule, detail string) {
	c.total++
	switch {
	case len(c.list) < c.max:
	case !c.bySeq:
		return
	case len(c.list) >= 2*c.max:
		slices.SortStableFunc(c.list, func(a, b Violation) int { return cmp.Compare(a.Seq, b.Seq) })
		c.list = c.list[:c.max]
	}
	c.list = append(c.list, Violation{Seq: seq, Rule: rule, Detail: detail})
}

func (c *collector) addf(seq uint64, rule, format string, args ...any) {
	c.add(seq, rule, fmt.Sprintf(format, args...))
}

// ParsePin parses "SEQ:HASH".
func ParsePin(s string) (*Pin, error) {
	var seq uint64
	var hash string
	if _, err := fmt.Sscanf(s, "%d:%s", &seq, &hash); err != nil {
		return nil, fmt.Errorf("parse head %q: want SEQ:HASH", s)
	}
	h, err := chain.ParseHash(hash)
	if err != nil {
		return nil, fmt.Errorf("parse head %q: %w", s, err)
	}
	return &Pin{Seq: seq, Hash: h.String()}, nil
}
