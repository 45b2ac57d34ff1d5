package ledgertest

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// ReserveReq is a write request for key by execution exec.
func ReserveReq(key, exec string) ledger.ReserveRequest {
	return ledger.ReserveRequest{IdempotencyKey: key, ExecutionID: exec, Tool: "payments.refund",
		Effect: chain.EffectWrite, Input: json.RawMessage(`{"order":7}`)}
}

// Succeed is a successful outcome of key's reservation token.
func Succeed(key, token string) ledger.CommitRequest {
	return ledger.CommitRequest{IdempotencyKey: key, Reservation: token, Outcome: chain.OutcomeSucceeded,
		ExternalRef: "re_1", Result: json.RawMessage(`{"amount": 1200}`)}
}

// Fail is a failed outcome of key's reservation token.
func Fail(key, token string, retryable bool) ledger.CommitRequest {
	return ledger.CommitRequest{IdempotencyKey: key, Reservation: token, Outcome: chain.OutcomeFailed,
		Error: &ledger.FailureDetail{Code: "TIMEOUT", Message: "gateway timed out", Retryable: retryable}}
}

// MustReserve reserves and fails tb on error.
func MustReserve(tb testing.TB, db *DB, req ledger.ReserveRequest) *ledger.ReserveResult {
	tb.Helper()
	res, err := db.Reserve(context.Background(), req)
	require.NoError(tb, err)
	return res
}

// MustCommit commits and fails tb on error.
func MustCommit(tb testing.TB, db *DB, req ledger.CommitRequest) *ledger.CommitResult {
	tb.Helper()
	res, err := db.Commit(context.Background(), req)
	require.NoError(tb, err)
	return res
}

// VerifyChain recomputes the default namespace's whole chain from the
// file and checks seq contiguity, links and hashes, and the head.
func VerifyChain(tb testing.TB, db *DB) []chain.Receipt {
	tb.Helper()
	var all []chain.Receipt
	after := uint64(0)
	for {
		rs, next, err := db.ListReceipts(context.Background(), ledger.ReceiptFilter{After: after, Limit: ledger.MaxPageLimit})
		require.NoError(tb, err)
		all = append(all, rs...)
		if next == nil {
			break
		}
		after = *next
	}
	prev := chain.ZeroHash
	for i, r := range all {
		require.Equal(tb, uint64(i+1), r.Seq, "seq contiguous")
		require.Equal(tb, prev, r.PrevHash, "prev_hash of %d", r.Seq)
		require.NoError(tb, r.Check())
		prev = r.Hash
	}
	h := db.Head()
	require.Equal(tb, uint64(len(all)), h.Seq)
	require.Equal(tb, prev, h.Hash)
	return all
}
