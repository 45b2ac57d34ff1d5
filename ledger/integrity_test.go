package ledger_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// spec2Commit is the commit of SPEC §2's test vector, linked after its
// reserve.
func spec2Commit() (chain.Receipt, chain.Hash) {
	reserve := chain.Link(0, chain.ZeroHash, chain.Receipt{Kind: chain.KindReserve, IdempotencyKey: "refund-order-1234",
		ExecutionID: "exec-1", Attempt: 1, Tool: "payments.refund", Effect: chain.EffectWrite, Idempotent: true,
		InputHash:      "sha256:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8",
		LeaseExpiresAt: 1764475230000, RecordedAt: 1764475200000})
	commit := chain.Link(1, reserve.Hash, chain.Receipt{Kind: chain.KindCommit, IdempotencyKey: "refund-order-1234",
		ExecutionID: "exec-1", Attempt: 1, Tool: "payments.refund", Effect: chain.EffectWrite, Idempotent: true,
		InputHash: reserve.InputHash, Outcome: chain.OutcomeSucceeded, ExternalRef: "re_3Pq9",
		Result: `{"amount":1200,"currency":"eur"}`, RefSeq: 1, RecordedAt: 1764475200450})
	return commit, commit.Hash
}

func TestCheckStored(t *testing.T) {
	for _, tt := range []struct {
		desc    string
		tamper  func(r *chain.Receipt, chained *chain.Hash)
		wantErr bool
	}{
		{"OK", func(*chain.Receipt, *chain.Hash) {}, false},
		{"ErrResult", func(r *chain.Receipt, _ *chain.Hash) { r.Result = `{"amount":9200,"currency":"eur"}` }, true},
		{"ErrResultRehashed", func(r *chain.Receipt, _ *chain.Hash) {
			r.Result = `{"amount":9200,"currency":"eur"}`
			r.Hash = r.ComputeHash(r.PrevHash)
		}, true},
		{"ErrChained", func(_ *chain.Receipt, c *chain.Hash) { c[0] ^= 1 }, true},
		{"ErrMalformed", func(r *chain.Receipt, _ *chain.Hash) {
			r.Malformed = []chain.Malformed{{Field: "attempt", Value: "-1"}}
		}, true},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			r, chained := spec2Commit()
			assert.Equal(t, "5696e522798aa5923576765d1e4184cdd8076fbac9c7ea31056382427453c3c4", r.Hash.String())
			tt.tamper(&r, &chained)
			err := ledger.CheckStored(&r, chained)
			if !tt.wantErr {
				assert.NoError(t, err)
				return
			}
			var ie *ledger.IntegrityError
			assert.True(t, errors.As(err, &ie), "got %v", err)
			assert.ErrorIs(t, err, chain.ErrHashMismatch)
			assert.Equal(t, ledger.ECodeIntegrityError, ledger.ErrorCode(err))
			assert.NotContains(t, ledger.ErrorMessage(err), "9200")
		})
	}
}

// BenchmarkCheckStored is the CPU the check adds to serving one recorded
// outcome (SPEC §2's commit: one SHA-256 over its prefix, prev_hash and
// body).
func BenchmarkCheckStored(b *testing.B) {
	r, chained := spec2Commit()
	b.ReportAllocs()
	for b.Loop() {
		if err := ledger.CheckStored(&r, chained); err != nil {
			b.Fatal(err)
		}
	}
}
