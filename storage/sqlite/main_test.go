package sqlite_test

// key is the idempotency key most tests reserve.
const key = "refund-order-1234"

func i64(v int64) *int64 { return &v }
