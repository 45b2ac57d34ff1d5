package verify

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
)

// DefaultStateBudget bounds the memory of the single pass's key states
// (bytes). Keys beyond it are spilled to temporary files, by a hash of
// the key, and replayed from there after the pass.
const DefaultStateBudget = 56 << 20

// slot is the compact state of one key: what the rules need in the common
// case, with strings as keyed hashes (stringHash), in one 64-byte cache
// line. Everything else (the strings a violation or an audit entry names,
// the latest reserve's recorded_at, the final receipt's error code) is
// read again by seq when a rule needs it: the receipts at firstSeq,
// latestSeq and finalSeq hold it, as they did when the state was built.
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
	slotSeen        // the derived key records hold the key
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
	gates    map[keyHashes]gateLink  // the keys with an ask (keyState.gate)
	// reconciled holds keyState.reconciled of the keys with a reserve a
	// reconcile finalized (SPEC §15): few, and kept whole, strings and
	// all, since a late commit of one may come after the key's rerun.
	reconciled map[keyHashes][]reconciledReserve
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
	t := &stateTable{maxSlots: maxSlots, more: map[keyHashes][]execAttempt{}, far: map[keyHashes][2]uint64{},
		gates: map[keyHashes]gateLink{}, reconciled: map[keyHashes][]reconciledReserve{}}
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
	t.slots, t.mem, t.held, t.more, t.far, t.gates, t.reconciled = nil, slotMemory{}, nil, nil, nil, nil, nil
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

// slotState is keyState.state of a slot at unix ms t, except that a key
// whose outcome was not_applied reads as failed (a slot keeps no outcome):
// finish hydrates such keys, and keyState.state tells the two apart.
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
