package verify

import (
	"fmt"
	"math"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"

	"github.com/effect-ledger/effect-ledger/chain"
)

// TestFailureGate checks which receipts start the repeated-failures query
// of a single pass, and that a pass without one skips it.
func TestFailureGate(t *testing.T) {
	assert.True(t, (*failureGate)(nil).wait(), "no gate: the query runs")
	failed := chain.Receipt{Kind: chain.KindCommit, Outcome: chain.OutcomeFailed, InputHash: "h"}
	for name, tc := range map[string]struct {
		r    chain.Receipt
		want bool
	}{
		"failed commit":                  {failed, true},
		"failed resolve":                 {chain.Receipt{Kind: chain.KindResolve, Outcome: chain.OutcomeFailed, InputHash: "h"}, true},
		"malformed row":                  {chain.Receipt{Kind: chain.KindReserve, Malformed: []chain.Malformed{{Field: "row"}}}, true},
		"failed commit without an input": {chain.Receipt{Kind: chain.KindCommit, Outcome: chain.OutcomeFailed}, false},
		"succeeded commit":               {chain.Receipt{Kind: chain.KindCommit, Outcome: chain.OutcomeSucceeded, InputHash: "h"}, false},
		"reserve":                        {chain.Receipt{Kind: chain.KindReserve, InputHash: "h"}, false},
	} {
		t.Run(name, func(t *testing.T) {
			g := newFailureGate()
			g.see(&tc.r)
			g.see(&tc.r) // a second one closes nothing twice
			g.passDone()
			assert.Equal(t, tc.want, g.wait())
		})
	}
	// The query starts at the first failure, before the pass ends.
	g := newFailureGate()
	started := make(chan bool)
	go func() { started <- g.wait() }()
	g.see(&failed)
	assert.True(t, <-started)
	g.passDone()
}

// TestStateTable_held checks the bitmap of a full table: no key in the
// table is ever called absent, and most keys not in it are.
func TestStateTable_held(t *testing.T) {
	tbl, err := newStateTable(1000*slotBytes, 10)
	if err != nil {
		t.Fatal(err)
	}
	defer tbl.release()
	var in []keyHashes
	for i := 0; ; i++ {
		h := hashKey(fmt.Sprintf("key-%d", i))
		if tbl.absent(h) {
			t.Fatalf("key %d called absent before the table is full", i)
		}
		s, err := tbl.insert(h)
		if err != nil {
			t.Fatal(err)
		}
		if s == nil {
			break
		}
		in = append(in, h)
	}
	assert.NotNil(t, tbl.held, "a full table has its bitmap")
	assert.Len(t, in, 3*1000/4)
	for _, h := range in {
		assert.False(t, tbl.absent(h))
		_, found := tbl.find(h)
		assert.True(t, found)
	}
	absent := 0
	for i := range 10000 {
		if tbl.absent(hashKey(fmt.Sprintf("other-%d", i))) {
			absent++
		}
	}
	assert.Greater(t, absent, 9000, "one bit in about 21 is set")
}

// TestSeqDelta checks the seqs a slot holds as offsets and those it
// does not.
func TestSeqDelta(t *testing.T) {
	for _, tc := range []struct {
		first, seq uint64
		d          uint32
		ok         bool
	}{{5, 0, 0, true}, {5, 5, 1, true}, {5, 6, 2, true}, {5, 4, 0, false},
		{1, 1 + math.MaxUint32 - 1, math.MaxUint32, true}, {1, 1 + math.MaxUint32, 0, false}} {
		d, ok := seqDelta(tc.first, tc.seq)
		assert.Equal(t, tc.d, d, "%d after %d", tc.seq, tc.first)
		assert.Equal(t, tc.ok, ok, "%d after %d", tc.seq, tc.first)
	}
	tbl, err := newStateTable(1<<20, 10)
	if err != nil {
		t.Fatal(err)
	}
	defer tbl.release()
	s, _ := tbl.insert(hashKey("k"))
	s.firstSeq = 10
	for _, want := range [][2]uint64{{10, 0}, {12, 11}, {10 + 1<<33, 0}, {11, 10 + 1<<40}, {0, 0}} {
		tbl.setSeqs(s, want[0], want[1])
		l, f := tbl.seqs(s)
		assert.Equal(t, want, [2]uint64{l, f})
		assert.Equal(t, want[0] > 1<<32 || want[1] > 1<<32, s.flags&slotFar != 0)
	}
	assert.Empty(t, tbl.far, "a slot back in range leaves the side map")
	assert.Equal(t, uintptr(slotBytes), unsafe.Sizeof(slot{}), "a slot is one cache line")
}
