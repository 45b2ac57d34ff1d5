package verify

import (
	"testing"

	"github.com/effect-ledger/effect-ledger/chain"
)

// openGeneration follows §12's generations and §15's late commits.
func TestOpenGeneration(t *testing.T) {
	const ttl = 1000
	res := func(seq, ref, at uint64) chain.Receipt {
		return chain.Receipt{Seq: seq, Kind: chain.KindReserve, RefSeq: ref, RecordedAt: at}
	}
	fin := func(kind string, seq, at uint64) chain.Receipt {
		return chain.Receipt{Seq: seq, Kind: kind, RecordedAt: at}
	}
	for _, tc := range []struct {
		desc  string
		rs    []chain.Receipt
		first uint64
		open  bool
	}{
		{"no reserve", []chain.Receipt{{Seq: 3, Kind: chain.KindAsk}}, 0, false},
		{"reserved", []chain.Receipt{res(2, 0, 0)}, 2, true},
		{"finished", []chain.Receipt{res(2, 0, 0), fin(chain.KindCommit, 3, 10)}, 2, false},
		{"not_applied, reserved again", []chain.Receipt{res(2, 0, 0), fin(chain.KindCommit, 3, 10), res(5, 3, 20)}, 2, true},
		{"renewed after the ttl", []chain.Receipt{res(2, 0, 0), fin(chain.KindCommit, 3, 10), res(9, 3, 10+ttl)}, 9, true},
		{"renewed from a replay", []chain.Receipt{res(2, 0, 0), fin(chain.KindCommit, 3, 10), {Seq: 4, Kind: chain.KindReplay}, res(9, 4, 20)}, 9, true},
		{"reconciled, then a late commit", []chain.Receipt{res(2, 0, 0), fin(chain.KindReconcile, 3, 10), res(5, 3, 20),
			fin(chain.KindCommit, 6, 30), fin(chain.KindCommit, 7, 40)}, 2, false},
		{"through an approval to its ask", []chain.Receipt{res(2, 0, 0), fin(chain.KindCommit, 3, 10),
			{Seq: 5, Kind: chain.KindAsk, RefSeq: 3}, {Seq: 6, Kind: chain.KindApproval, RefSeq: 5}, res(7, 6, 10+ttl)}, 7, true},
	} {
		first, open := openGeneration(tc.rs, ttl)
		if first != tc.first || open != tc.open {
			t.Errorf("%s: first %d open %v, want %d %v", tc.desc, first, open, tc.first, tc.open)
		}
	}
}

// keyHistory.inUse follows SPEC §13's asks and approvals as of a sweep:
// an ask waiting for its answer, or approved and not consumed, and such
// an approval, are in use until the ask expires; an ask and approval a
// reserve consumed belong to that reserve's generation, in use until it
// has an outcome, whatever the ask's expiry.
func TestKeyHistory_inUse(t *testing.T) {
	const expiry = 1000
	ask := chain.Receipt{Seq: 2, Kind: chain.KindAsk, LeaseExpiresAt: expiry}
	approved := chain.Receipt{Seq: 3, Kind: chain.KindApproval, RefSeq: 2, Outcome: chain.OutcomeApproved}
	rejected := chain.Receipt{Seq: 3, Kind: chain.KindApproval, RefSeq: 2, Outcome: chain.OutcomeRejected}
	consumer := chain.Receipt{Seq: 4, Kind: chain.KindReserve, RefSeq: 3}
	final := chain.Receipt{Seq: 5, Kind: chain.KindCommit, RefSeq: 4}
	// A replay of the success, and a reserve renewing the key from it
	// (SPEC §12): a generation of its own, in flight.
	replay := chain.Receipt{Seq: 6, Kind: chain.KindReplay, RefSeq: 5}
	renewal := chain.Receipt{Seq: 7, Kind: chain.KindReserve, RefSeq: 6}
	for _, tc := range []struct {
		desc   string
		rs     []chain.Receipt
		sweep  uint64 // the sweep's seq: the receipts before it apply
		at     uint64 // and its recorded_at
		listed uint64
		inUse  bool
	}{
		{"an ask waiting", []chain.Receipt{ask}, 9, 500, 2, true},
		{"an ask expired unanswered", []chain.Receipt{ask}, 9, expiry, 2, false},
		{"an ask answered after the sweep", []chain.Receipt{ask, approved}, 3, 500, 2, true},
		{"an ask approved, not consumed", []chain.Receipt{ask, approved}, 9, 500, 2, true},
		{"its approval", []chain.Receipt{ask, approved}, 9, 500, 3, true},
		{"the approval, its ask expired", []chain.Receipt{ask, approved}, 9, expiry, 3, false},
		{"an ask rejected", []chain.Receipt{ask, rejected}, 9, 500, 2, false},
		{"the rejection", []chain.Receipt{ask, rejected}, 9, 500, 3, false},
		{"an ask consumed, the key in flight", []chain.Receipt{ask, approved, consumer}, 9, 500, 2, true},
		{"its approval", []chain.Receipt{ask, approved, consumer}, 9, 500, 3, true},
		{"both, past the ask's expiry", []chain.Receipt{ask, approved, consumer}, 9, expiry, 3, true},
		{"the ask consumed, the key final", []chain.Receipt{ask, approved, consumer, final}, 9, 500, 2, false},
		{"the approval consumed", []chain.Receipt{ask, approved, consumer, final}, 9, 500, 3, false},
		{"the ask consumed, the key renewed since", []chain.Receipt{ask, approved, consumer, final, replay, renewal}, 9, 500, 2, false},
		{"its approval, the key renewed since", []chain.Receipt{ask, approved, consumer, final, replay, renewal}, 9, 500, 3, false},
		{"a rejection a reserve in flight named", []chain.Receipt{ask, rejected, consumer}, 9, 500, 2, false},
		{"the renewal in flight", []chain.Receipt{ask, approved, consumer, final, replay, renewal}, 9, 500, 7, true},
		{"the consumer in flight", []chain.Receipt{ask, approved, consumer}, 9, 500, 4, true},
		{"the approval consumed after the sweep", []chain.Receipt{ask, approved, consumer, final}, 4, 500, 3, true},
	} {
		k := newKeyHistory(tc.rs, 0)
		k.through(tc.sweep)
		if got := k.inUse(tc.listed, tc.at) != ""; got != tc.inUse {
			t.Errorf("%s: in use %v, want %v (%q)", tc.desc, got, tc.inUse, k.inUse(tc.listed, tc.at))
		}
	}
}
