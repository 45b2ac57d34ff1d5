package verify

// NewKeyOrdered returns a Verifier of db whose full runs check the key
// states in key order, as incremental runs do, instead of in the single
// seq-ordered pass: the tests require both to report the same.
func NewKeyOrdered(db DB, opts Opts) *Verifier {
	v := New(db, opts)
	v.keyOrder = true
	return v
}
