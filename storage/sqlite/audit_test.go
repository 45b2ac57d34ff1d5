package sqlite_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

func TestReader_RepeatedFailures(t *testing.T) {
	db := ledgertest.Open(t)
	ctx := context.Background()
	call := func(key, tool, input string) string {
		req := testkit.ReserveReq(key, "exec-"+key)
		req.Tool, req.Input = tool, json.RawMessage(input)
		return ledgertest.MustReserve(t, db, req).Reservation
	}
	tok := call("refund-a-0001", "payments.refund", `{"order":7}`)          // 1
	ledgertest.MustCommit(t, db, testkit.Fail("refund-a-0001", tok, false)) // 2
	tok = call("charge-a-0001", "payments.charge", `{"order":7}`)           // 3
	ledgertest.MustCommit(t, db, testkit.Fail("charge-a-0001", tok, false)) // 4: never run again
	call("refund-b-0002", "payments.refund", `{"order":7}`)                 // 5
	call("refund-c-0003", "payments.refund", `{"order":8}`)                 // 6: another input

	rows := func(tool string) []ledger.CallAfterFailure {
		var out []ledger.CallAfterFailure
		require.NoError(t, db.Reader.RepeatedFailures(ctx, tool, func(c *ledger.CallAfterFailure) error {
			out = append(out, *c)
			return nil
		}))
		return out
	}
	t.Run("OK", func(t *testing.T) {
		got := rows("")
		require.Len(t, got, 2, "the charge failed but was never run again: no rows")
		assert.True(t, got[0].Failure)
		assert.Equal(t, "refund-a-0001", got[0].Key)
		assert.Equal(t, "TIMEOUT", got[0].ErrorCode)
		assert.Equal(t, uint64(2), got[0].Seq)
		assert.False(t, got[1].Failure)
		assert.Equal(t, "refund-b-0002", got[1].Key)
		assert.Equal(t, "exec-refund-b-0002", got[1].ExecutionID)
		assert.Equal(t, uint64(5), got[1].Seq)
		assert.Equal(t, got[0].InputHash, got[1].InputHash)
	})
	t.Run("tool", func(t *testing.T) {
		assert.Len(t, rows("payments.refund"), 2)
		assert.Empty(t, rows("payments.charge"))
	})
	t.Run("ErrCallback", func(t *testing.T) {
		stop := assert.AnError
		err := db.Reader.RepeatedFailures(ctx, "", func(*ledger.CallAfterFailure) error { return stop })
		assert.ErrorIs(t, err, stop)
	})
	// The plan reads the chain in one seq-ordered pass and builds an
	// index only on the small per-call table: an automatic index or a
	// sort over receipts would grow with the ledger.
	t.Run("plan", func(t *testing.T) {
		_, r := db.Store.Pools()
		plan, err := r.QueryContext(ctx, "EXPLAIN QUERY PLAN "+sqlite.SQLRepeatedFailures, 0, "")
		require.NoError(t, err)
		defer plan.Close()
		var lines []string
		for plan.Next() {
			var id, parent, notused int
			var detail string
			require.NoError(t, plan.Scan(&id, &parent, &notused, &detail))
			lines = append(lines, detail)
		}
		require.NoError(t, plan.Err())
		text := strings.Join(lines, "\n")
		assert.Contains(t, text, "SEARCH ns_receipts USING INDEX sqlite_autoindex_ns_receipts_1 (ns=? AND seq>?)", text)
		assert.Contains(t, text, "SEARCH f USING AUTOMATIC COVERING INDEX (tool=? AND input_hash=?)", text)
		assert.NotContains(t, text, "ns_receipts USING AUTOMATIC", text)
	})
}
