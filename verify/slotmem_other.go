//go:build !linux

package verify

// slotMemory is the Go heap where anonymous mappings are not at hand.
type slotMemory struct{ s []slot }

func allocSlots(n int) (slotMemory, error) { return slotMemory{make([]slot, n)}, nil }

func (m slotMemory) slots() []slot { return m.s }

func (m slotMemory) free() {}
