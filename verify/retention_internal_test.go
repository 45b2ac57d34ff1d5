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
