package verify

// NewWithStateBudget returns a Verifier whose single pass holds at most
// budget bytes of key states, so that tests can force the spill files.
func NewWithStateBudget(src Source, opts Opts, budget int) *Verifier {
	v := New(src, opts)
	v.stateBudget = budget
	return v
}
