package tlog_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/mod/sumdb/note"
	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// eraseLog is a committed chain of 5 receipts: commits 1 and 2 (result
// and note committed), an unrelated commit 3, a policy 4 and receipt 5
// erasing the results and notes of 1 and 2, with its ranges' opening.
type eraseLog struct {
	rs     []chain.Receipt
	tree   *hashes
	signer note.Signer
	v      note.Verifier
	ranges []chain.Range
	salt   chain.Salt
}

func newEraseLog(t testing.TB) *eraseLog {
	t.Helper()
	skey, vkey, err := tlog.GenerateKey("ex.test")
	require.NoError(t, err)
	l := &eraseLog{tree: &hashes{}, ranges: []chain.Range{{1, 2}}, salt: chain.NewSalt()}
	l.signer, _, _, err = tlog.LoadSignerText(skey, "ex.test")
	require.NoError(t, err)
	l.v, err = tlog.NewVerifier(vkey)
	require.NoError(t, err)
	erase := chain.EraseResult{Set: chain.SetDigest(l.salt, l.ranges), Count: 2, Fields: []string{"result", "note"}}
	var prev chain.Hash
	for i := range 5 {
		r := chain.Receipt{Kind: chain.KindCommit, IdempotencyKey: "refund-order-1234", ExecutionID: "e", Attempt: 1,
			Tool: "t", Effect: chain.EffectWrite, Outcome: "succeeded", RecordedAt: 1,
			Result: chain.Commit(chain.FieldResult, chain.NewSalt(), `{"to":"someone"}`),
			Note:   chain.Commit(chain.FieldNote, chain.NewSalt(), "a note")}
		switch i {
		case 3:
			r = chain.Receipt{Kind: chain.KindPolicy, Result: `{}`, RecordedAt: 1}
		case 4:
			r = chain.Receipt{Kind: chain.KindErase, Result: erase.Text(), RecordedAt: 1}
		}
		r = chain.Link(uint64(i), prev, r)
		prev = r.Hash
		hs, err := sumdb.StoredHashesForRecordHash(int64(i), tlog.LeafHash(r.Hash), l.tree)
		require.NoError(t, err)
		*l.tree = append(*l.tree, hs...)
		l.rs = append(l.rs, r)
	}
	return l
}

// inclusion proves seq in the tree of size n.
func (l *eraseLog) inclusion(t testing.TB, seq uint64, n int64) []tlog.HexHash {
	t.Helper()
	p, err := tlog.ProveInclusion(n, tlog.LeafIndex(seq), l.tree)
	require.NoError(t, err)
	return tlog.HexHashes(p)
}

// bundle is the portable receipt of seq under the checkpoint of size n,
// its result and note erased by receipt 5, with erased_by.
func (l *eraseLog) bundle(t testing.TB, seq uint64, n int64) tlog.PortableReceipt {
	t.Helper()
	root, err := tlog.TreeHash(n, l.tree)
	require.NoError(t, err)
	msg, err := tlog.SignCheckpoint(tlog.Checkpoint{Origin: "ex.test/default", Size: n, Root: root}, []note.Signer{l.signer})
	require.NoError(t, err)
	erasure := []tlog.HexHash{}
	if n >= 5 {
		erasure = l.inclusion(t, 5, n)
	}
	return tlog.PortableReceipt{Receipt: l.rs[seq-1], LeafIndex: tlog.LeafIndex(seq), Inclusion: l.inclusion(t, seq, n),
		Checkpoint: string(msg), Payloads: &tlog.Disclosures{}, Erased: map[string]uint64{"result": 5, "note": 5},
		ErasedBy: &tlog.ErasureProof{Receipt: l.rs[4], Inclusion: erasure, Ranges: l.ranges, Salt: l.salt.String()}}
}

// check encodes p, parses it back and checks it as check-proof does.
func (l *eraseLog) check(t *testing.T, p tlog.PortableReceipt) (map[string]string, error) {
	t.Helper()
	b, err := json.Marshal(p)
	require.NoError(t, err)
	parsed, err := tlog.ParsePortable(b)
	require.NoError(t, err)
	c, err := tlog.CheckPortableAny(parsed, []note.Verifier{l.v}, "default")
	require.NoError(t, err)
	return tlog.CheckDisclosures(parsed, c)
}

// TestCheckDisclosures_erasedBy: a bundle carrying its erase receipt,
// included under its checkpoint, with the ranges' opening, proves the
// erasure; a holder may drop erased_by; every mismatch is refused.
func TestCheckDisclosures_erasedBy(t *testing.T) {
	l := newEraseLog(t)
	t.Run("OK", func(t *testing.T) {
		fields, err := l.check(t, l.bundle(t, 2, 5))
		require.NoError(t, err)
		assert.Equal(t, map[string]string{"result": "erased by 5", "note": "erased by 5"}, fields)
	})
	t.Run("OK without erased_by", func(t *testing.T) {
		p := l.bundle(t, 2, 5)
		p.ErasedBy = nil
		fields, err := l.check(t, p)
		require.NoError(t, err)
		assert.Equal(t, "not disclosed (issuer says erased by 5)", fields["result"])
	})
	t.Run("OK under a later checkpoint", func(t *testing.T) {
		l := newEraseLog(t)
		fields, err := l.check(t, l.bundle(t, 1, 5))
		require.NoError(t, err)
		assert.Equal(t, "erased by 5", fields["note"])
	})
	t.Run("OK re-encoded", func(t *testing.T) {
		b, err := json.Marshal(l.bundle(t, 2, 5))
		require.NoError(t, err)
		var doc any
		require.NoError(t, json.Unmarshal(b, &doc))
		re, err := json.MarshalIndent(doc, "", "  ") // members sorted, spaces added
		require.NoError(t, err)
		p, err := tlog.ParsePortable(re)
		require.NoError(t, err)
		c, err := tlog.CheckPortableAny(p, []note.Verifier{l.v}, "default")
		require.NoError(t, err)
		fields, err := tlog.CheckDisclosures(p, c)
		require.NoError(t, err)
		assert.Equal(t, "erased by 5", fields["result"])
	})
	for _, tt := range []struct {
		desc    string
		edit    func(t *testing.T, p *tlog.PortableReceipt)
		wantErr error
		want    string
	}{
		{"altered ranges", func(_ *testing.T, p *tlog.PortableReceipt) { p.ErasedBy.Ranges = []chain.Range{{1, 3}} },
			tlog.ErrErasureProof, "the ranges and salt do not open its set"},
		{"ranges without the receipt", func(_ *testing.T, p *tlog.PortableReceipt) { p.ErasedBy.Ranges = []chain.Range{{1, 1}} },
			tlog.ErrErasureProof, "the ranges and salt do not open its set"},
		{"altered salt", func(_ *testing.T, p *tlog.PortableReceipt) { p.ErasedBy.Salt = chain.NewSalt().String() },
			tlog.ErrErasureProof, "the ranges and salt do not open its set"},
		{"malformed salt", func(_ *testing.T, p *tlog.PortableReceipt) { p.ErasedBy.Salt = "00" }, tlog.ErrErasureProof, "salt"},
		{"seq outside the ranges", func(t *testing.T, p *tlog.PortableReceipt) { *p = l.bundle(t, 3, 5) },
			tlog.ErrErasureProof, "receipt 3 is in none of its ranges"},
		{"wrong kind", func(t *testing.T, p *tlog.PortableReceipt) {
			p.ErasedBy.Receipt, p.ErasedBy.Inclusion = l.rs[3], l.inclusion(t, 4, 5)
			p.Erased = map[string]uint64{"result": 4}
		}, tlog.ErrErasureProof, "policy receipt (seq 4), not an erase receipt"},
		{"inclusion for another leaf", func(t *testing.T, p *tlog.PortableReceipt) { p.ErasedBy.Inclusion = l.inclusion(t, 4, 5) },
			tlog.ErrProof, "erase receipt 5: proof does not verify"},
		{"inclusion altered", func(_ *testing.T, p *tlog.PortableReceipt) { p.ErasedBy.Inclusion[0][0] ^= 1 },
			tlog.ErrProof, "erase receipt 5: proof does not verify"},
		{"erase beyond the checkpoint", func(t *testing.T, p *tlog.PortableReceipt) { *p = l.bundle(t, 2, 4) },
			tlog.ErrProof, "outside the tree of size 4"},
		{"field not listed", func(_ *testing.T, p *tlog.PortableReceipt) { p.Erased["external_ref"] = 5 },
			tlog.ErrErasureProof, "its fields do not list external_ref"},
		{"erase receipt edited", func(_ *testing.T, p *tlog.PortableReceipt) {
			p.ErasedBy.Receipt.Result = `{"count":9,"fields":["result"],"set":"sha256:` + strings.Repeat("0", 64) + `"}`
		}, tlog.ErrReceiptHash, "erased_by"},
		{"erase named by no field", func(_ *testing.T, p *tlog.PortableReceipt) { p.Erased = map[string]uint64{"result": 6} },
			tlog.ErrErasureProof, "erased names for no field"},
		{"erase not after the receipt", func(t *testing.T, p *tlog.PortableReceipt) {
			*p = l.bundle(t, 5, 5)
			p.Erased = map[string]uint64{"note": 5}
		}, tlog.ErrErasureProof, "erase receipt 5 is not after receipt 5"},
		{"an inline receipt", func(_ *testing.T, p *tlog.PortableReceipt) { p.Payloads = nil }, tlog.ErrErasureProof, "inline"},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			p := l.bundle(t, 2, 5)
			tt.edit(t, &p)
			_, err := l.check(t, p)
			require.ErrorIs(t, err, tt.wantErr)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

// TestParsePortable_erasedBy: erased_by has exactly its four members, a
// receipt in its exact form and ranges of integer pairs, sorted.
func TestParsePortable_erasedBy(t *testing.T) {
	l := newEraseLog(t)
	b, err := json.Marshal(l.bundle(t, 2, 5))
	require.NoError(t, err)
	good := string(b)
	_, err = tlog.ParsePortable(b)
	require.NoError(t, err)
	ranges := `"ranges":[[1,2]]`
	require.Contains(t, good, ranges)
	for _, tt := range []struct{ desc, doc string }{
		{"unknown member", strings.Replace(good, `"erased_by":{`, `"erased_by":{"checkpoint":"x",`, 1)},
		{"member twice", strings.Replace(good, ranges, ranges+","+ranges, 1)},
		{"no salt", strings.Replace(good, `,"salt":"`+l.salt.String()+`"`, "", 1)},
		{"no ranges", strings.Replace(good, ranges+",", "", 1)},
		{"unknown receipt field", strings.Replace(good, `"erased_by":{"receipt":{`, `"erased_by":{"receipt":{"x":1,`, 1)},
		{"a range of three", strings.Replace(good, ranges, `"ranges":[[1,2,3]]`, 1)},
		{"a range of one", strings.Replace(good, ranges, `"ranges":[[1]]`, 1)},
		{"a fractional seq", strings.Replace(good, ranges, `"ranges":[[1,2.0]]`, 1)},
		{"a negative seq", strings.Replace(good, ranges, `"ranges":[[-1,2]]`, 1)},
		{"seq 0", strings.Replace(good, ranges, `"ranges":[[0,2]]`, 1)},
		{"ranges unsorted", strings.Replace(good, ranges, `"ranges":[[3,3],[1,2]]`, 1)},
		{"ranges overlapping", strings.Replace(good, ranges, `"ranges":[[1,2],[2,3]]`, 1)},
		{"no ranges at all", strings.Replace(good, ranges, `"ranges":[]`, 1)},
		{"ranges null", strings.Replace(good, ranges, `"ranges":null`, 1)},
		{"erased_by an array", strings.Replace(good[:len(good)-1], `"erased_by":{`, `"erased_by":[{`, 1) + "]}"},
		{"erased_by in a key receipt", good[:len(good)-1] + `,"keys":[` + good + "]}"},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			require.NotEqual(t, good, tt.doc)
			_, err := tlog.ParsePortable([]byte(tt.doc))
			assert.ErrorIs(t, err, tlog.ErrPortableForm)
		})
	}
}
