package verify

import (
	"context"
	"fmt"
	"math"
	"strings"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// singlePass replays the receipts of one seq-ordered pass (or a spill
// file of it) through the state rules, key state in a stateTable.
type singlePass struct {
	ctx    context.Context
	src    DB
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
	if e.kind == evPolicy {
		return nil
	}
	if t.absent(e.key) {
		return l.spillEvent(e)
	}
	s, found := t.find(e.key)
	if !found && t.held != nil {
		// The table is full and the key is not in it, though its bit
		// (shared with another key) did not say so: its earlier receipts
		// went to the spill files, and this one follows them, whatever
		// its kind (an approval dropped here would leave the reserve
		// that consumes it naming an unknown receipt).
		return l.spillEvent(e)
	}
	if !found && e.kind == evNoState {
		return nil // the key's first receipt, which holds no state
	}
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
	var k *keyState
	if first {
		k = &keyState{key: r.IdempotencyKey, first: *r}
		p.state.first(k, r)
	} else {
		var err error
		if k, err = l.hydrate(s); err != nil {
			return err
		}
		p.state.next(k, r)
	}
	if k.countsForAttempts(r) {
		k.record(r.ExecutionID, r.Attempt)
	}
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
		k.latest = reserveOf(r)
	}
	if finalSeq != 0 {
		r, err := p.read(finalSeq)
		if err != nil {
			return nil, err
		}
		k.final = finalOf(r)
	}
	k.gate = l.table.gates[keyHashes{s.key0, s.key1}]
	k.reconciled = append(k.reconciled, l.table.reconciled[keyHashes{s.key0, s.key1}]...)
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
	if k.gate != (gateLink{}) {
		l.table.gates[h] = k.gate
	} else {
		delete(l.table.gates, h)
	}
	if len(k.reconciled) > 0 {
		l.table.reconciled[h] = append(l.table.reconciled[h][:0], k.reconciled...)
	} else {
		delete(l.table.reconciled, h)
	}
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

// finish ends a level: the keys table rows come (from the table or a
// spill file) and are checked against the states, the keys' final
// states go to the audit, and then each spill file is replayed as a
// level of its own.
func (l *level) finish(keys func(fn func(*ledger.KeyRecord) error) error) error {
	p := l.p
	if p.drift != nil {
		if err := keys(l.keyRow); err != nil && !p.drift.unavailable(err) {
			return err
		}
	}
	t := l.table
	for i := range t.slots {
		s := &t.slots[i]
		if s.flags&slotUsed == 0 {
			continue
		}
		if p.drift.comparing() && s.flags&(slotReserve|slotSeen) == slotReserve {
			k, err := l.hydrate(s)
			if err != nil {
				return err
			}
			p.drift.suspectf(k.first.Seq, k.key, nil, "there is no derived key record for key %q", k.key)
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
		p.drift.suspectf(row.FirstSeq, key, row, "the derived key records have key %q, which has no receipts", key)
		return nil
	}
	s.flags |= slotSeen
	if s.flags&slotReserve == 0 {
		key := strings.Clone(row.Key)
		p.drift.suspectf(row.FirstSeq, key, row, "the derived key records have key %q, which has no reserve", key)
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
		p.drift.suspectf(want.FirstSeq, k.key, row, "the derived key record of %q is %+v; the receipts give %+v", k.key, *row, want)
	}
	return nil
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
