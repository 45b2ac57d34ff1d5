//go:build linux

package verify

import (
	"syscall"
	"unsafe"
)

// slotMemory is anonymous memory mapped for a table's slots: pages the
// table never touches cost nothing, and the garbage collector neither
// scans it (slots hold no pointers) nor counts it when it paces itself.
type slotMemory struct{ b []byte }

func allocSlots(n int) (slotMemory, error) {
	b, err := syscall.Mmap(-1, 0, n*int(unsafe.Sizeof(slot{})), syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return slotMemory{}, err
	}
	// Huge pages where the kernel offers them: lookups land at random
	// in tens of MiB, and 4 KiB pages make most of them a TLB miss too.
	_ = syscall.Madvise(b, 14) // MADV_HUGEPAGE; a refusal changes nothing
	return slotMemory{b}, nil
}

func (m slotMemory) slots() []slot {
	if len(m.b) == 0 {
		return nil
	}
	return unsafe.Slice((*slot)(unsafe.Pointer(&m.b[0])), len(m.b)/int(unsafe.Sizeof(slot{})))
}

func (m slotMemory) free() {
	if m.b != nil {
		_ = syscall.Munmap(m.b)
	}
}
