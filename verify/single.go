package verify

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"math"
	"math/bits"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"unsafe"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// SeqSource is a KeySource that can also read one receipt by seq and
// answers the duplicate, repeat and keys-table queries itself (the SQLite
// file). A full run of a SeqSource reads the chain once, in seq order:
// the chain checks and the key state machine share the pass, and each
// key's state is held in a few machine words (see stateTable).
type SeqSource interface {
	KeySource
	DerivedSource
	DuplicateSource
	RepeatSource
	GetReceipt(ctx context.Context, seq uint64) (*chain.Receipt, error)
}

// DefaultStateBudget bounds the memory of the single pass's key states
// (bytes). Keys beyond it are spilled to temporary files, by a hash of
// the key, and replayed from there after the pass.
const DefaultStateBudget = 56 << 20

// slot is the compact state of one key: what the rules need in the common
// case, with strings as keyed hashes (stringHash), in one 64-byte cache
// line. Everything else (the
// strings a violation or an audit entry names, the latest reserve's
// recorded_at, the final receipt's error code) is read again by seq when
// a rule needs it: the receipts at firstSeq, latestSeq and finalSeq hold
// it, as they did when the state was built.
type slot struct {
	key0          uint64 // stringHash of the key
	key1          uint32 // a second, independent hash of the key
	flags         uint32
	firstSeq      uint64
	fp            uint64 // fingerprintHash of the first receipt
	firstExec     uint64 // stringHash of the first receipt's execution
	lease         uint64
	latestD       uint32 // the latest reserve's seq - firstSeq + 1; 0 if none (see stateTable.seqs)
	finalD        uint32 // the final receipt's seq - firstSeq + 1; 0 if none
	att           uint32 // highest attempt of firstExec, unless slotMore
	latestAttempt uint32 // the latest reserve's attempt, unless slotBig
}

const (
	slotUsed = 1 << iota
	slotReserve
	slotFinalized
	slotSucceeded
	slotRetryable
	slotMore        // the attempts are in stateTable.more
	slotBig         // an attempt does not fit 32 bits: latestAttempt is read again
	slotSeen        // the keys table has a row for the key
	slotLatestFirst // the latest reserve's execution is firstExec
	slotFar         // latestD and finalD do not fit: the seqs are in stateTable.far
)

// slotBytes is the size of a slot, for the budget.
const slotBytes = 64

// keyHashes are the two hashes that name a key in a stateTable.
type keyHashes struct {
	k0 uint64
	k1 uint32
}

func hashKey(key string) keyHashes {
	return keyHashes{stringHash(key), uint32(stringHash2(key))}
}

// fingerprintHash hashes what must not change across a key's receipts.
func fingerprintHash(tool, effect, inputHash string, idempotent, keyGenerated bool) uint64 {
	var h maphash.Hash
	h.SetSeed(hashSeed)
	var b [14]byte
	binary.LittleEndian.PutUint32(b[0:], uint32(len(tool)))
	binary.LittleEndian.PutUint32(b[4:], uint32(len(effect)))
	binary.LittleEndian.PutUint32(b[8:], uint32(len(inputHash)))
	b[12], b[13] = boolByte(idempotent), boolByte(keyGenerated)
	_, _ = h.Write(b[:])
	_, _ = h.WriteString(tool)
	_, _ = h.WriteString(effect)
	_, _ = h.WriteString(inputHash)
	return h.Sum64()
}

// stateTable is an open-addressing table of slots that grows up to a
// fixed number of slots. The slots live outside the Go heap (slotMemory),
// so that a table of tens of MiB does not double the heap the garbage
// collector lets grow.
type stateTable struct {
	slots    []slot
	mem      slotMemory
	n        int
	maxSlots int
	more     map[keyHashes][]execAttempt
	far      map[keyHashes][2]uint64 // latest reserve, final seqs of slotFar slots
	// held, once the table is full (no key is added after that), has a
	// bit set for each key in it, by the low bits of key0: a key whose
	// bit is clear is not in the table, known without a search (which
	// at ¾ load reads about 8 slots to find an empty one). Every receipt
	// and keys row of a spilled key asks.
	held []uint64
}

// newStateTable returns a table within budget bytes, sized at first for
// about hint keys.
func newStateTable(budget int, hint uint64) (*stateTable, error) {
	maxSlots := max(budget/slotBytes, 4)
	t := &stateTable{maxSlots: maxSlots, more: map[keyHashes][]execAttempt{}, far: map[keyHashes][2]uint64{}}
	n := min(uint64(maxSlots), max(hint+hint/3, 1024))
	if err := t.alloc(int(n)); err != nil {
		return nil, err
	}
	return t, nil
}

func (t *stateTable) alloc(n int) error {
	m, err := allocSlots(n)
	if err != nil {
		return fmt.Errorf("key state table: %w", err)
	}
	t.mem, t.slots = m, m.slots()
	return nil
}

// release returns the table's memory.
func (t *stateTable) release() {
	t.mem.free()
	t.slots, t.mem, t.held, t.more, t.far = nil, slotMemory{}, nil, nil, nil
}

// seqs returns the seqs of a slot's latest reserve and final receipt (0:
// none).
func (t *stateTable) seqs(s *slot) (latest, final uint64) {
	if s.flags&slotFar != 0 {
		v := t.far[keyHashes{s.key0, s.key1}]
		return v[0], v[1]
	}
	if s.latestD != 0 {
		latest = s.firstSeq + uint64(s.latestD) - 1
	}
	if s.finalD != 0 {
		final = s.firstSeq + uint64(s.finalD) - 1
	}
	return latest, final
}

// setSeqs sets what seqs returns; s.firstSeq must be set.
func (t *stateTable) setSeqs(s *slot, latest, final uint64) {
	h := keyHashes{s.key0, s.key1}
	dl, okL := seqDelta(s.firstSeq, latest)
	df, okF := seqDelta(s.firstSeq, final)
	if okL && okF {
		if s.flags&slotFar != 0 {
			delete(t.far, h)
		}
		s.flags &^= slotFar
		s.latestD, s.finalD = dl, df
		return
	}
	s.flags |= slotFar
	s.latestD, s.finalD = 0, 0
	t.far[h] = [2]uint64{latest, final}
}

// seqDelta is seq as a slot holds it: seq - first + 1, 0 for 0; false if
// it does not fit.
func seqDelta(first, seq uint64) (uint32, bool) {
	switch {
	case seq == 0:
		return 0, true
	case seq < first || seq-first >= math.MaxUint32:
		return 0, false
	}
	return uint32(seq - first + 1), true
}

func (t *stateTable) index(h keyHashes) int {
	hi, _ := bits.Mul64(h.k0, uint64(len(t.slots)))
	return int(hi)
}

// find returns the key's slot, or the empty slot where it would go (nil
// when the table is full).
func (t *stateTable) find(h keyHashes) (*slot, bool) {
	for i := t.index(h); ; i++ {
		if i == len(t.slots) {
			i = 0
		}
		s := &t.slots[i]
		if s.flags&slotUsed == 0 {
			return s, false
		}
		if s.key0 == h.k0 && s.key1 == h.k1 {
			return s, true
		}
	}
}

// insert returns a new slot for a key that find did not find, or nil
// when the table is at its size limit.
func (t *stateTable) insert(h keyHashes) (*slot, error) {
	// At most three quarters full: once keys are spilled, every receipt of
	// a spilled key looks for it in vain, and a search ends at the first
	// empty slot (about 8 slots on average at this load, 50 at 0.9).
	if 4*(t.n+1) > 3*len(t.slots) {
		if len(t.slots) == t.maxSlots {
			t.hold()
			return nil, nil
		}
		if err := t.grow(); err != nil {
			return nil, err
		}
	}
	s, _ := t.find(h)
	t.n++
	*s = slot{key0: h.k0, key1: h.k1, flags: slotUsed}
	return s, nil
}

// hold fills t.held, on the first insert the full table refuses.
func (t *stateTable) hold() {
	if t.held != nil {
		return
	}
	// 16 bits per slot (a power of two at least that): with the table ¾
	// full, about one bit in 21 is set.
	n := 1 << bits.Len(uint(16*len(t.slots)-1))
	t.held = make([]uint64, n/64)
	for i := range t.slots {
		if s := &t.slots[i]; s.flags&slotUsed != 0 {
			b := s.key0 & uint64(n-1)
			t.held[b/64] |= 1 << (b % 64)
		}
	}
}

// absent reports whether the key is known not to be in the table without
// a search: the table is full and the key's bit is clear.
func (t *stateTable) absent(h keyHashes) bool {
	if t.held == nil {
		return false
	}
	b := h.k0 & uint64(64*len(t.held)-1)
	return t.held[b/64]&(1<<(b%64)) == 0
}

func (t *stateTable) grow() error {
	oldMem, old := t.mem, t.slots
	if err := t.alloc(min(2*len(old), t.maxSlots)); err != nil {
		return err
	}
	for i := range old {
		if old[i].flags&slotUsed != 0 {
			s, _ := t.find(keyHashes{old[i].key0, old[i].key1})
			*s = old[i]
		}
	}
	oldMem.free()
	return nil
}

// event is what the fast paths need of a receipt; spilled receipts are
// written as events and read again by seq when a slow path needs them.
type event struct {
	seq, refSeq, exec, attempt, fp, lease uint64
	key                                   keyHashes
	kind                                  uint8
	succeeded, retryable                  bool
}

const (
	evOther = iota
	evReserve
	evCommit
	evReplay
)

func eventOf(r *chain.Receipt) event {
	e := event{seq: r.Seq, refSeq: r.RefSeq, exec: stringHash(r.ExecutionID), attempt: r.Attempt,
		fp:  fingerprintHash(r.Tool, r.Effect, r.InputHash, r.Idempotent, r.KeyGenerated),
		key: hashKey(r.IdempotencyKey), lease: r.LeaseExpiresAt, succeeded: r.Outcome == chain.OutcomeSucceeded,
		retryable: r.Retryable}
	switch r.Kind {
	case chain.KindReserve:
		e.kind = evReserve
	case chain.KindCommit:
		e.kind = evCommit
	case chain.KindReplay:
		e.kind = evReplay
	}
	return e
}

const eventBytes = 8*7 + 4 + 4

func (e *event) put(b []byte) {
	le := binary.LittleEndian
	for i, v := range [...]uint64{e.seq, e.refSeq, e.exec, e.attempt, e.fp, e.lease, e.key.k0} {
		le.PutUint64(b[8*i:], v)
	}
	le.PutUint32(b[56:], e.key.k1)
	b[60], b[61], b[62] = e.kind, boolByte(e.succeeded), boolByte(e.retryable)
}

func (e *event) get(b []byte) {
	le := binary.LittleEndian
	*e = event{seq: le.Uint64(b), refSeq: le.Uint64(b[8:]), exec: le.Uint64(b[16:]), attempt: le.Uint64(b[24:]),
		fp: le.Uint64(b[32:]), lease: le.Uint64(b[40:]), key: keyHashes{le.Uint64(b[48:]), le.Uint32(b[56:])},
		kind: b[60], succeeded: b[61] == 1, retryable: b[62] == 1}
}

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}

// spillParts is how many files the keys that do not fit are spread over
// at each level.
const spillParts = 16

// maxLevel is the last level: its table grows past the budget, as the
// 32 bits of key1 are used up (16⁸ spill files of 16⁸ keys' worth of
// budget each are not reached in practice).
const maxLevel = 8

// partition is the spill file of a key at a level (4 bits of key1 each).
func (h keyHashes) partition(level int) int { return int(h.k1>>(4*level)) % spillParts }

// spill is a set of spill files of one level, for receipts and keys rows.
type spill struct {
	dir    string
	level  int
	events [spillParts]*spillFile
	keys   [spillParts]*spillFile
	rows   [spillParts]uint64 // keys rows in each keys file
	buf    []byte             // a keys row being written
}

type spillFile struct {
	f *os.File
	w *bufio.Writer
}

func (s *spill) file(set *[spillParts]*spillFile, p int, what string) (*spillFile, error) {
	if set[p] == nil {
		f, err := os.Create(filepath.Join(s.dir, fmt.Sprintf("%s-%d-%d", what, s.level, p)))
		if err != nil {
			return nil, fmt.Errorf("spill key states: %w", err)
		}
		set[p] = &spillFile{f: f, w: bufio.NewWriterSize(f, 32<<10)}
	}
	return set[p], nil
}

func (s *spill) close() {
	for _, set := range [][spillParts]*spillFile{s.events, s.keys} {
		for _, f := range set {
			if f != nil {
				_ = f.f.Close()
				_ = os.Remove(f.f.Name())
			}
		}
	}
}

// singlePass replays the receipts of one seq-ordered pass (or a spill
// file of it) through the state rules, key state in a stateTable.
type singlePass struct {
	ctx    context.Context
	src    SeqSource
	state  *stateChecker
	drift  *driftChecker
	budget int
	hint   uint64 // at least as many as the keys level 0 will see (0: unknown)
	dir    string // temporary directory of the spill files, made on first use
	now    uint64
}

// level is the replay of one stateTable: level 0 is the chain pass, level
// n the spill files of level n-1.
type level struct {
	p     *singlePass
	n     int
	table *stateTable
	spill *spill
}

func (p *singlePass) newLevel(n int, hint uint64) (*level, error) {
	budget := p.budget
	if n == maxLevel { // key1 has no bits left to spread keys over
		budget = math.MaxInt
	}
	t, err := newStateTable(budget, hint)
	if err != nil {
		return nil, err
	}
	return &level{p: p, n: n, table: t}, nil
}

// add applies a receipt read by the pass; r is nil for a spilled event
// (read again by seq when a slow path needs it).
func (l *level) add(e *event, r *chain.Receipt) error {
	t := l.table
	if t.absent(e.key) {
		return l.spillEvent(e)
	}
	s, found := t.find(e.key)
	if !found {
		var err error
		if s, err = t.insert(e.key); err != nil {
			return err
		} else if s == nil {
			return l.spillEvent(e)
		}
		if e.kind == evReserve && e.refSeq == 0 && e.attempt <= math.MaxUint32 {
			s.flags |= slotReserve | slotLatestFirst
			s.firstSeq, s.fp, s.firstExec = e.seq, e.fp, e.exec
			s.latestD, s.lease, s.latestAttempt, s.att = 1, e.lease, uint32(e.attempt), uint32(e.attempt)
			return nil
		}
		return l.slow(s, e, r, true)
	}
	if e.fp == s.fp && s.flags&(slotBig|slotMore|slotFar) == 0 && e.exec == s.firstExec {
		switch {
		case e.kind == evCommit && s.flags&(slotReserve|slotFinalized|slotLatestFirst) == slotReserve|slotLatestFirst &&
			s.latestD != 0 && e.refSeq == s.firstSeq+uint64(s.latestD)-1 && e.attempt == uint64(s.latestAttempt) &&
			e.seq >= s.firstSeq && e.seq-s.firstSeq < math.MaxUint32:
			s.flags |= slotFinalized
			s.flags &^= slotSucceeded | slotRetryable
			if e.succeeded {
				s.flags |= slotSucceeded
			}
			if e.retryable {
				s.flags |= slotRetryable
			}
			s.finalD = uint32(e.seq - s.firstSeq + 1)
			return nil
		case e.kind == evReplay && s.flags&(slotFinalized|slotSucceeded) == slotFinalized|slotSucceeded &&
			s.finalD != 0 && e.refSeq == s.firstSeq+uint64(s.finalD)-1 && e.attempt <= math.MaxUint32:
			s.att = max(s.att, uint32(e.attempt))
			return nil
		}
	}
	return l.slow(s, e, r, false)
}

// slow applies a receipt through the rules with the key's full state,
// read again from the receipts the slot points at.
func (l *level) slow(s *slot, e *event, r *chain.Receipt, first bool) error {
	p := l.p
	if r == nil {
		var err error
		if r, err = p.read(e.seq); err != nil {
			return err
		}
	}
	if first {
		k := &keyState{key: r.IdempotencyKey, first: *r}
		p.state.first(k, r)
		k.record(r.ExecutionID, r.Attempt)
		l.compact(s, k)
		return nil
	}
	k, err := l.hydrate(s)
	if err != nil {
		return err
	}
	p.state.next(k, r)
	k.record(r.ExecutionID, r.Attempt)
	l.compact(s, k)
	return nil
}

func (p *singlePass) read(seq uint64) (*chain.Receipt, error) {
	r, err := p.src.GetReceipt(p.ctx, seq)
	if err != nil {
		return nil, fmt.Errorf("read receipt %d again: %w", seq, err)
	}
	return r, nil
}

// hydrate rebuilds the full state of a slot's key.
func (l *level) hydrate(s *slot) (*keyState, error) {
	p := l.p
	first, err := p.read(s.firstSeq)
	if err != nil {
		return nil, err
	}
	k := &keyState{key: first.IdempotencyKey, first: *first}
	k.first.Result, k.first.Note, k.first.ErrorMessage, k.first.ExternalRef = "", "", "", ""
	k.hasReserve = s.flags&slotReserve != 0
	k.finalized = s.flags&slotFinalized != 0
	latestSeq, finalSeq := l.table.seqs(s)
	if latestSeq != 0 {
		r, err := p.read(latestSeq)
		if err != nil {
			return nil, err
		}
		k.latest = reserveInfo{seq: r.Seq, attempt: r.Attempt, lease: r.LeaseExpiresAt, recordedAt: r.RecordedAt, execution: r.ExecutionID}
	}
	if finalSeq != 0 {
		r, err := p.read(finalSeq)
		if err != nil {
			return nil, err
		}
		k.final = finalInfo{seq: r.Seq, recordedAt: r.RecordedAt, kind: r.Kind, outcome: r.Outcome,
			code: r.ErrorCode, retryable: r.Retryable, succeeded: r.Outcome == chain.OutcomeSucceeded}
	}
	if s.flags&slotMore != 0 {
		k.attempts = append(k.attempts, l.table.more[keyHashes{s.key0, s.key1}]...)
	} else {
		k.attempts = append(k.attempts, execAttempt{s.firstExec, uint64(s.att)})
	}
	return k, nil
}

// compact writes a full key state back into its slot.
func (l *level) compact(s *slot, k *keyState) {
	h := keyHashes{s.key0, s.key1}
	keep := s.flags & (slotSeen | slotFar) // setSeqs clears slotFar
	*s = slot{key0: h.k0, key1: h.k1, flags: slotUsed | keep, firstSeq: k.first.Seq,
		fp:        fingerprintHash(k.first.Tool, k.first.Effect, k.first.InputHash, k.first.Idempotent, k.first.KeyGenerated),
		firstExec: stringHash(k.first.ExecutionID), lease: k.latest.lease}
	l.table.setSeqs(s, k.latest.seq, k.final.seq)
	for _, f := range []struct {
		on   bool
		flag uint32
	}{{k.hasReserve, slotReserve}, {k.finalized, slotFinalized}, {k.final.succeeded, slotSucceeded}, {k.final.retryable, slotRetryable}} {
		if f.on {
			s.flags |= f.flag
		}
	}
	if k.hasReserve && stringHash(k.latest.execution) == s.firstExec {
		s.flags |= slotLatestFirst
	}
	if k.latest.attempt <= math.MaxUint32 {
		s.latestAttempt = uint32(k.latest.attempt)
	} else {
		s.flags |= slotBig
	}
	if len(k.attempts) == 1 && k.attempts[0].execution == s.firstExec && k.attempts[0].attempt <= math.MaxUint32 {
		s.att = uint32(k.attempts[0].attempt)
		delete(l.table.more, h)
	} else {
		s.flags |= slotMore
		l.table.more[h] = append(l.table.more[h][:0], k.attempts...)
	}
}

func (l *level) spillEvent(e *event) error {
	if l.spill == nil {
		dir, err := l.p.spillDir()
		if err != nil {
			return fmt.Errorf("spill key states: %w", err)
		}
		l.spill = &spill{dir: dir, level: l.n}
	}
	f, err := l.spill.file(&l.spill.events, e.key.partition(l.n), "events")
	if err != nil {
		return err
	}
	var b [eventBytes]byte
	e.put(b[:])
	if _, err := f.w.Write(b[:]); err != nil {
		return fmt.Errorf("spill key states: %w", err)
	}
	return nil
}

// finish ends a level: the keys table rows come (from the table or a
// spill file) and are checked against the states, the keys' final
// states go to the audit, and then each spill file is replayed as a
// level of its own.
func (l *level) finish(keys func(fn func(*ledger.KeyRecord) error) error) error {
	p := l.p
	if p.drift != nil {
		if err := keys(l.keyRow); err != nil {
			return err
		}
	}
	t := l.table
	for i := range t.slots {
		s := &t.slots[i]
		if s.flags&slotUsed == 0 {
			continue
		}
		if p.drift != nil && s.flags&(slotReserve|slotSeen) == slotReserve {
			k, err := l.hydrate(s)
			if err != nil {
				return err
			}
			p.drift.suspectf(k.first.Seq, k.key, "keys table has no row for key %q", k.key)
		}
		if st := slotState(s, p.now); st == "interrupted" || st == "failed" {
			k, err := l.hydrate(s)
			if err != nil {
				return err
			}
			p.state.finishKey(k, p.now)
		}
	}
	l.table.release() // the next level gets the memory
	l.table = nil
	if l.spill == nil {
		return nil
	}
	defer l.spill.close()
	for part := range spillParts {
		if err := l.replay(part); err != nil {
			return err
		}
	}
	return nil
}

// slotState is keyState.state of a slot at unix ms t.
func slotState(s *slot, t uint64) string {
	switch {
	case s.flags&(slotFinalized|slotSucceeded) == slotFinalized|slotSucceeded:
		return "succeeded"
	case s.flags&slotFinalized != 0:
		return "failed"
	case s.flags&slotReserve == 0:
		return "none"
	case t < s.lease:
		return "reserved"
	default:
		return "interrupted"
	}
}

// keyRow checks a keys table row against the key's state, or passes it
// on to the spill file of its key.
func (l *level) keyRow(row *ledger.KeyRecord) error {
	p := l.p
	h := hashKey(row.Key)
	var s *slot
	found := false
	if !l.table.absent(h) {
		s, found = l.table.find(h)
	}
	if !found {
		if l.spill != nil && l.spill.events[h.partition(l.n)] != nil {
			return l.spillKey(h, row)
		}
		key := strings.Clone(row.Key) // the row's strings may be a spill buffer's
		p.drift.suspectf(row.FirstSeq, key, "keys table has key %q, which has no receipts", key)
		return nil
	}
	s.flags |= slotSeen
	if s.flags&slotReserve == 0 {
		key := strings.Clone(row.Key)
		p.drift.suspectf(row.FirstSeq, key, "keys table has key %q, which has no reserve", key)
		return nil
	}
	latestSeq, finalSeq := l.table.seqs(s)
	if row.FirstSeq == s.firstSeq && row.ReserveSeq == latestSeq && row.LeaseExpiresAt == s.lease &&
		row.FinalSeq == finalSeq && row.TokenHash == "" &&
		fingerprintHash(row.Tool, row.Effect, row.InputHash, row.Idempotent, row.Generated) == s.fp {
		return nil
	}
	k, err := l.hydrate(s)
	if err != nil {
		return err
	}
	if want := wantRecord(k); *row != want {
		p.drift.suspectf(want.FirstSeq, k.key, "keys row for %q is %+v; the receipts give %+v", k.key, *row, want)
	}
	return nil
}

// A spilled keys row is a fixed head (the record's length, the lengths
// of its five strings, its four integers and two booleans) and then the
// strings' bytes.
const keyRowHead = 4 + 5*4 + 4*8 + 2

func (l *level) spillKey(h keyHashes, row *ledger.KeyRecord) error {
	part := h.partition(l.n)
	f, err := l.spill.file(&l.spill.keys, part, "keys")
	if err != nil {
		return err
	}
	l.spill.rows[part]++
	strs := [5]string{row.Key, row.Tool, row.Effect, row.InputHash, row.TokenHash}
	n := keyRowHead
	for _, s := range strs {
		n += len(s)
	}
	b := l.spill.buf[:0]
	b = binary.LittleEndian.AppendUint32(b, uint32(n))
	for _, s := range strs {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
	}
	for _, v := range [...]uint64{row.FirstSeq, row.ReserveSeq, row.LeaseExpiresAt, row.FinalSeq} {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	b = append(b, boolByte(row.Generated), boolByte(row.Idempotent))
	for _, s := range strs {
		b = append(b, s...)
	}
	l.spill.buf = b
	if _, err := f.w.Write(b); err != nil {
		return fmt.Errorf("spill key states: %w", err)
	}
	return nil
}

// readKeys calls fn for each keys row of a spill file. The row's strings
// are valid only during fn: they point into a buffer the next row
// reuses (keyRow copies what it keeps).
func readKeys(r *bufio.Reader, fn func(*ledger.KeyRecord) error) error {
	le := binary.LittleEndian
	var head [keyRowHead]byte
	var buf []byte
	for {
		if _, err := io.ReadFull(r, head[:]); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("read spilled keys: %w", err)
		}
		n := int(le.Uint32(head[:]))
		if n < keyRowHead {
			return errors.New("read spilled keys: bad record")
		}
		if cap(buf) < n-keyRowHead {
			buf = make([]byte, max(n-keyRowHead, 2*cap(buf)))
		}
		b := buf[:n-keyRowHead]
		if _, err := io.ReadFull(r, b); err != nil {
			return fmt.Errorf("read spilled keys: %w", err)
		}
		all := unsafe.String(unsafe.SliceData(b), len(b))
		var strs [5]string
		off := 0
		for i := range strs {
			l := int(le.Uint32(head[4+4*i:]))
			if l > len(all)-off {
				return errors.New("read spilled keys: bad record")
			}
			strs[i], off = all[off:off+l], off+l
		}
		ints := head[4+5*4:]
		row := ledger.KeyRecord{Key: strs[0], Tool: strs[1], Effect: strs[2], InputHash: strs[3], TokenHash: strs[4],
			FirstSeq: le.Uint64(ints), ReserveSeq: le.Uint64(ints[8:]), LeaseExpiresAt: le.Uint64(ints[16:]),
			FinalSeq: le.Uint64(ints[24:]), Generated: ints[32] == 1, Idempotent: ints[33] == 1}
		if err := fn(&row); err != nil {
			return err
		}
	}
}

// replay runs the spill files of one partition as the next level.
func (l *level) replay(part int) error {
	ev, keys := l.spill.events[part], l.spill.keys[part]
	if ev == nil {
		return nil
	}
	for _, f := range []*spillFile{ev, keys} {
		if f == nil {
			continue
		}
		if err := f.w.Flush(); err != nil {
			return fmt.Errorf("spill key states: %w", err)
		}
		if _, err := f.f.Seek(0, io.SeekStart); err != nil {
			return fmt.Errorf("spill key states: %w", err)
		}
	}
	st, err := ev.f.Stat()
	if err != nil {
		return fmt.Errorf("spill key states: %w", err)
	}
	// The next level's table is sized for its keys: at most one per
	// event, and in a ledger whose keys table is whole, about one per
	// keys row (a reserve and a commit make two events). Fewer would
	// only make it grow.
	rows := l.spill.rows[part]
	next, err := l.p.newLevel(l.n+1, min(uint64(st.Size()/eventBytes), rows+rows/8+1024))
	if err != nil {
		return err
	}
	defer func() {
		if next.table != nil {
			next.table.release()
		}
	}()
	r := bufio.NewReaderSize(ev.f, 64<<10)
	var b [eventBytes]byte
	var e event
	for {
		if err := l.p.ctx.Err(); err != nil {
			return err
		}
		if _, err := io.ReadFull(r, b[:]); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return fmt.Errorf("read spilled receipts: %w", err)
		}
		e.get(b[:])
		if err := next.add(&e, nil); err != nil {
			return err
		}
	}
	return next.finish(func(fn func(*ledger.KeyRecord) error) error {
		if keys == nil {
			return nil
		}
		return readKeys(bufio.NewReaderSize(keys.f, 64<<10), fn)
	})
}

// wantRecord is the keys table row the receipts give a key with a reserve.
func wantRecord(k *keyState) ledger.KeyRecord {
	want := ledger.KeyRecord{Key: k.key, Generated: k.first.KeyGenerated, Tool: k.first.Tool,
		Effect: k.first.Effect, InputHash: k.first.InputHash, Idempotent: k.first.Idempotent,
		FirstSeq: k.first.Seq, ReserveSeq: k.latest.seq, LeaseExpiresAt: k.latest.lease}
	if k.final.seq != 0 {
		want.FinalSeq = k.final.seq
	}
	return want
}

// spillDir returns the temporary directory of the spill files, made on
// first use.
func (p *singlePass) spillDir() (string, error) {
	if p.dir == "" {
		dir, err := os.MkdirTemp("", "ledger-verify-*")
		if err != nil {
			return "", err
		}
		p.dir = dir
	}
	return p.dir, nil
}

// cleanup removes the spill directory, if one was made.
func (p *singlePass) cleanup() {
	if p.dir != "" {
		_ = os.RemoveAll(p.dir)
	}
}

// successSet notes the (tool, input_hash) of every success (a commit or
// resolve that succeeded, with an input_hash), as the duplicate query
// selects them, by keyed 64-bit hash. When they may not fit a quarter of
// the state budget, they go to partition files by hash instead, each small
// enough to be sorted in that quarter.
type successSet struct {
	hashes []uint64
	unsure bool
	err    error // of the partition files

	p     *singlePass
	parts []*spillFile // nil: in memory
}

// newSuccessSet returns a set for a pass of about hint receipts.
func newSuccessSet(p *singlePass, hint uint64) *successSet {
	s := &successSet{p: p}
	if quarter := uint64(max(p.budget/4, 8)); hint*8 > quarter {
		s.parts = make([]*spillFile, min((hint*8+quarter-1)/quarter, 256))
	}
	return s
}

func (s *successSet) add(r *chain.Receipt) {
	if len(r.Malformed) > 0 {
		s.unsure = true
	}
	if (r.Kind != chain.KindCommit && r.Kind != chain.KindResolve) || r.Outcome != chain.OutcomeSucceeded || r.InputHash == "" {
		return
	}
	h := fingerprintHash(r.Tool, "", r.InputHash, false, false)
	if s.parts == nil {
		s.hashes = append(s.hashes, h)
		return
	}
	if s.err != nil {
		return
	}
	hi, _ := bits.Mul64(h, uint64(len(s.parts)))
	f := s.parts[hi]
	if f == nil {
		dir, err := s.p.spillDir()
		if err == nil {
			var fh *os.File
			fh, err = os.Create(filepath.Join(dir, fmt.Sprintf("successes-%d", hi)))
			f = &spillFile{f: fh, w: bufio.NewWriterSize(fh, 8<<10)}
		}
		if err != nil {
			s.err = fmt.Errorf("spill successes: %w", err)
			return
		}
		s.parts[hi] = f
	}
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], h)
	if _, err := f.w.Write(b[:]); err != nil {
		s.err = fmt.Errorf("spill successes: %w", err)
	}
}

// mayRepeat reports whether two successes may share a (tool, input_hash):
// only then can the ledger hold a duplicate effect. A malformed row (read
// column by column, where SQL compares values of other types its own way)
// or a failed partition file always answers yes.
func (s *successSet) mayRepeat() bool {
	defer s.close()
	if s.unsure || s.err != nil {
		return true
	}
	if s.parts == nil {
		return repeats(s.hashes)
	}
	for _, f := range s.parts {
		if f == nil {
			continue
		}
		if err := f.w.Flush(); err != nil {
			return true
		}
		st, err := f.f.Stat()
		if err != nil {
			return true
		}
		if _, err := f.f.Seek(0, io.SeekStart); err != nil {
			return true
		}
		r := bufio.NewReaderSize(f.f, 64<<10)
		hs := make([]uint64, st.Size()/8)
		var b [8]byte
		for i := range hs {
			if _, err := io.ReadFull(r, b[:]); err != nil {
				return true
			}
			hs[i] = binary.LittleEndian.Uint64(b[:])
		}
		if repeats(hs) {
			return true
		}
	}
	return false
}

func (s *successSet) close() {
	for _, f := range s.parts {
		if f != nil {
			_ = f.f.Close()
			_ = os.Remove(f.f.Name())
		}
	}
	s.parts = nil
}

// repeats reports whether hs holds a value twice; it sorts hs.
func repeats(hs []uint64) bool {
	slices.Sort(hs)
	for i := 1; i < len(hs); i++ {
		if hs[i] == hs[i-1] {
			return true
		}
	}
	return false
}

// batcher hands receipts, in order and in batches, to a pipeline of
// stages, each on a goroutine of its own: every stage sees every receipt,
// in order, after the stage before it. The receipts' strings are shared,
// not copied: the sources allocate them per receipt.
type batcher struct {
	cur  []chain.Receipt
	in   chan []chain.Receipt
	free chan []chain.Receipt
	done chan struct{}
}

const (
	batchReceipts = 256
	batchesAhead  = 4
)

func newBatcher(stages ...func(*chain.Receipt)) *batcher {
	n := batchesAhead * (len(stages) + 1)
	b := &batcher{in: make(chan []chain.Receipt, batchesAhead), free: make(chan []chain.Receipt, n), done: make(chan struct{})}
	for range n {
		b.free <- make([]chain.Receipt, 0, batchReceipts)
	}
	b.cur = <-b.free
	in := b.in
	for i, fn := range stages {
		out := make(chan []chain.Receipt, batchesAhead)
		last := i == len(stages)-1
		go func(in <-chan []chain.Receipt) {
			defer close(out)
			for batch := range in {
				for j := range batch {
					fn(&batch[j])
				}
				if !last {
					out <- batch
					continue
				}
				clear(batch) // drop the strings
				b.free <- batch[:0]
			}
		}(in)
		in = out
	}
	go func() {
		for range in { // the last stage's output channel only closes
		}
		close(b.done)
	}()
	return b
}

func (b *batcher) add(r *chain.Receipt) {
	if b.cur = append(b.cur, *r); len(b.cur) == batchReceipts {
		b.in <- b.cur
		b.cur = <-b.free
	}
}

// close hands on the last batch and waits until every stage has seen
// every receipt.
func (b *batcher) close() {
	if len(b.cur) > 0 {
		b.in <- b.cur
	}
	close(b.in)
	<-b.done
}
