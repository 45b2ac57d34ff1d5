package ledger_test

import (
	"github.com/effect-ledger/effect-ledger/internal/ledgertest"
)

// key is the idempotency key most tests reserve.
const key = "refund-order-1234"

// T0 is the test clock's start.
var T0 = ledgertest.T0

// MustOpenDB opens a ledger on a new file in a temp dir with a test clock.
var MustOpenDB = ledgertest.Open

// The requests and checks the tests share (internal/ledgertest).
var (
	reserveReq  = ledgertest.ReserveReq
	succeed     = ledgertest.Succeed
	fail        = ledgertest.Fail
	mustReserve = ledgertest.MustReserve
	mustCommit  = ledgertest.MustCommit
	verifyChain = ledgertest.VerifyChain
)

func i64(v int64) *int64 { return &v }
