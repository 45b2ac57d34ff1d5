package verify

// NewKeyOrdered returns a Verifier of db whose full runs check the key
// states in key order, as incremental runs do, instead of in the single
// seq-ordered pass: the tests require both to report the same.
func NewKeyOrdered(db DB, opts Opts) *Verifier {
	v := New(db, opts)
	v.keyOrder = true
	return v
}

// SetMaxSuspects bounds the keys a run re-checks one by one at n until
// the test ends.
func SetMaxSuspects(t interface{ Cleanup(func()) }, n int) {
	old := maxSuspects
	maxSuspects = n
	t.Cleanup(func() { maxSuspects = old })
}

// SetRetentionClaimBudget bounds the listed receipts a run holds before
// it checks them at n until the test ends.
func SetRetentionClaimBudget(t interface{ Cleanup(func()) }, n int) {
	old := retentionClaimBudget
	retentionClaimBudget = n
	t.Cleanup(func() { retentionClaimBudget = old })
}
