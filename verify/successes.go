package verify

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math/bits"
	"os"
	"path/filepath"
	"slices"

	"github.com/effect-ledger/effect-ledger/chain"
)

// successSet notes the (tool, input_hash) of every success (a commit or
// resolve that succeeded, with an input_hash), as the duplicate query
// selects them, by keyed 64-bit hash. When they may not fit a quarter of
// the state budget, they go to partition files by hash instead, each small
// enough to be sorted in that quarter.
type successSet struct {
	hashes []uint64
	unsure bool
	err    error // of the partition files

	p     *singlePass
	parts []*spillFile // nil: in memory
}

// newSuccessSet returns a set for a pass of about hint receipts.
func newSuccessSet(p *singlePass, hint uint64) *successSet {
	s := &successSet{p: p}
	if quarter := uint64(max(p.budget/4, 8)); hint*8 > quarter {
		s.parts = make([]*spillFile, min((hint*8+quarter-1)/quarter, 256))
	}
	return s
}

func (s *successSet) add(r *chain.Receipt) {
	if len(r.Malformed) > 0 {
		s.unsure = true
	}
	if (r.Kind != chain.KindCommit && r.Kind != chain.KindResolve && r.Kind != chain.KindReconcile) || r.Outcome != chain.OutcomeSucceeded || r.InputHash == "" {
		return
	}
	h := fingerprintHash(r.Tool, "", r.InputHash, false, false)
	if s.parts == nil {
		s.hashes = append(s.hashes, h)
		return
	}
	if s.err != nil {
		return
	}
	hi, _ := bits.Mul64(h, uint64(len(s.parts)))
	f := s.parts[hi]
	if f == nil {
		dir, err := s.p.spillDir()
		if err == nil {
			var fh *os.File
			fh, err = os.Create(filepath.Join(dir, fmt.Sprintf("successes-%d", hi)))
			f = &spillFile{f: fh, w: bufio.NewWriterSize(fh, 8<<10)}
		}
		if err != nil {
			s.err = fmt.Errorf("spill successes: %w", err)
			return
		}
		s.parts[hi] = f
	}
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], h)
	if _, err := f.w.Write(b[:]); err != nil {
		s.err = fmt.Errorf("spill successes: %w", err)
	}
}

// mayRepeat reports whether two successes may share a (tool, input_hash):
// only then can the ledger hold a duplicate effect. A malformed row (read
// column by column, where SQL compares values of other types its own way)
// or a failed partition file always answers yes.
func (s *successSet) mayRepeat() bool {
	defer s.close()
	if s.unsure || s.err != nil {
		return true
	}
	if s.parts == nil {
		return repeats(s.hashes)
	}
	for _, f := range s.parts {
		if f == nil {
			continue
		}
		if err := f.w.Flush(); err != nil {
			return true
		}
		st, err := f.f.Stat()
		if err != nil {
			return true
		}
		if _, err := f.f.Seek(0, io.SeekStart); err != nil {
			return true
		}
		r := bufio.NewReaderSize(f.f, 64<<10)
		hs := make([]uint64, st.Size()/8)
		var b [8]byte
		for i := range hs {
			if _, err := io.ReadFull(r, b[:]); err != nil {
				return true
			}
			hs[i] = binary.LittleEndian.Uint64(b[:])
		}
		if repeats(hs) {
			return true
		}
	}
	return false
}

func (s *successSet) close() {
	for _, f := range s.parts {
		if f != nil {
			_ = f.f.Close()
			_ = os.Remove(f.f.Name())
		}
	}
	s.parts = nil
}

// repeats reports whether hs holds a value twice; it sorts hs.
func repeats(hs []uint64) bool {
	slices.Sort(hs)
	for i := 1; i < len(hs); i++ {
		if hs[i] == hs[i-1] {
			return true
		}
	}
	return false
}
