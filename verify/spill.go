package verify

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"unsafe"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// event is what the fast paths need of a receipt; spilled receipts are
// written as events and read again by seq when a slow path needs them.
type event struct {
	seq, refSeq, exec, attempt, fp, lease uint64
	key                                   keyHashes
	kind                                  uint8
	succeeded, retryable                  bool
}

const (
	evOther = iota
	evReserve
	evCommit
	evReplay
	evPolicy  // no key: the key states skip it
	evNoState // deny, approval: no state of their own (holdsNoState)
)

func eventOf(r *chain.Receipt) event {
	e := event{seq: r.Seq, refSeq: r.RefSeq, exec: stringHash(r.ExecutionID), attempt: r.Attempt,
		fp:  fingerprintHash(r.Tool, r.Effect, r.InputHash, r.Idempotent, r.KeyGenerated),
		key: hashKey(r.IdempotencyKey), lease: r.LeaseExpiresAt, succeeded: r.Outcome == chain.OutcomeSucceeded,
		retryable: r.Retryable}
	switch r.Kind {
	case chain.KindReserve:
		e.kind = evReserve
	case chain.KindCommit:
		e.kind = evCommit
	case chain.KindReplay:
		e.kind = evReplay
	case chain.KindPolicy, chain.KindErase, chain.KindKey, chain.KindPrune:
		e.kind = evPolicy // keyless: no key state
	case chain.KindDeny, chain.KindApproval:
		e.kind = evNoState
	}
	return e
}

const eventBytes = 8*7 + 4 + 4

func (e *event) put(b []byte) {
	le := binary.LittleEndian
	for i, v := range [...]uint64{e.seq, e.refSeq, e.exec, e.attempt, e.fp, e.lease, e.key.k0} {
		le.PutUint64(b[8*i:], v)
	}
	le.PutUint32(b[56:], e.key.k1)
	b[60], b[61], b[62] = e.kind, boolByte(e.succeeded), boolByte(e.retryable)
}

func (e *event) get(b []byte) {
	le := binary.LittleEndian
	*e = event{seq: le.Uint64(b), refSeq: le.Uint64(b[8:]), exec: le.Uint64(b[16:]), attempt: le.Uint64(b[24:]),
		fp: le.Uint64(b[32:]), lease: le.Uint64(b[40:]), key: keyHashes{le.Uint64(b[48:]), le.Uint32(b[56:])},
		kind: b[60], succeeded: b[61] == 1, retryable: b[62] == 1}
}

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}

// spillParts is how many files the keys that do not fit are spread over
// at each level.
const spillParts = 16

// maxLevel is the last level: its table grows past the budget, as the
// 32 bits of key1 are used up (16⁸ spill files of 16⁸ keys' worth of
// budget each are not reached in practice).
const maxLevel = 8

// partition is the spill file of a key at a level (4 bits of key1 each).
func (h keyHashes) partition(level int) int { return int(h.k1>>(4*level)) % spillParts }

// spill is a set of spill files of one level, for receipts and keys rows.
type spill struct {
	dir    string
	level  int
	events [spillParts]*spillFile
	keys   [spillParts]*spillFile
	rows   [spillParts]uint64 // keys rows in each keys file
	buf    []byte             // a keys row being written
}

type spillFile struct {
	f *os.File
	w *bufio.Writer
}

func (s *spill) file(set *[spillParts]*spillFile, p int, what string) (*spillFile, error) {
	if set[p] == nil {
		f, err := os.Create(filepath.Join(s.dir, fmt.Sprintf("%s-%d-%d", what, s.level, p)))
		if err != nil {
			return nil, fmt.Errorf("spill key states: %w", err)
		}
		set[p] = &spillFile{f: f, w: bufio.NewWriterSize(f, 32<<10)}
	}
	return set[p], nil
}

func (s *spill) close() {
	for _, set := range [][spillParts]*spillFile{s.events, s.keys} {
		for _, f := range set {
			if f != nil {
				_ = f.f.Close()
				_ = os.Remove(f.f.Name())
			}
		}
	}
}

func (l *level) spillEvent(e *event) error {
	if l.spill == nil {
		dir, err := l.p.spillDir()
		if err != nil {
			return fmt.Errorf("spill key states: %w", err)
		}
		l.spill = &spill{dir: dir, level: l.n}
	}
	f, err := l.spill.file(&l.spill.events, e.key.partition(l.n), "events")
	if err != nil {
		return err
	}
	var b [eventBytes]byte
	e.put(b[:])
	if _, err := f.w.Write(b[:]); err != nil {
		return fmt.Errorf("spill key states: %w", err)
	}
	return nil
}

// A spilled keys row is a fixed head (the record's length, the lengths
// of its five strings, its four integers and two booleans) and then the
// strings' bytes.
const keyRowHead = 4 + 5*4 + 4*8 + 2

func (l *level) spillKey(h keyHashes, row *ledger.KeyRecord) error {
	part := h.partition(l.n)
	f, err := l.spill.file(&l.spill.keys, part, "keys")
	if err != nil {
		return err
	}
	l.spill.rows[part]++
	strs := [5]string{row.Key, row.Tool, row.Effect, row.InputHash, row.TokenHash}
	n := keyRowHead
	for _, s := range strs {
		n += len(s)
	}
	b := l.spill.buf[:0]
	b = binary.LittleEndian.AppendUint32(b, uint32(n))
	for _, s := range strs {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
	}
	for _, v := range [...]uint64{row.FirstSeq, row.ReserveSeq, row.LeaseExpiresAt, row.FinalSeq} {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	b = append(b, boolByte(row.Generated), boolByte(row.Idempotent))
	for _, s := range strs {
		b = append(b, s...)
	}
	l.spill.buf = b
	if _, err := f.w.Write(b); err != nil {
		return fmt.Errorf("spill key states: %w", err)
	}
	return nil
}

// readKeys calls fn for each keys row of a spill file. The row's strings
// are valid only during fn: they point into a buffer the next row
// reuses (keyRow copies what it keeps).
func readKeys(r *bufio.Reader, fn func(*ledger.KeyRecord) error) error {
	le := binary.LittleEndian
	var head [keyRowHead]byte
	var buf []byte
	for {
		if _, err := io.ReadFull(r, head[:]); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("read spilled keys: %w", err)
		}
		n := int(le.Uint32(head[:]))
		if n < keyRowHead {
			return errors.New("read spilled keys: bad record")
		}
		if cap(buf) < n-keyRowHead {
			buf = make([]byte, max(n-keyRowHead, 2*cap(buf)))
		}
		b := buf[:n-keyRowHead]
		if _, err := io.ReadFull(r, b); err != nil {
			return fmt.Errorf("read spilled keys: %w", err)
		}
		all := unsafe.String(unsafe.SliceData(b), len(b))
		var strs [5]string
		off := 0
		for i := range strs {
			l := int(le.Uint32(head[4+4*i:]))
			if l > len(all)-off {
				return errors.New("read spilled keys: bad record")
			}
			strs[i], off = all[off:off+l], off+l
		}
		ints := head[4+5*4:]
		row := ledger.KeyRecord{Key: strs[0], Tool: strs[1], Effect: strs[2], InputHash: strs[3], TokenHash: strs[4],
			FirstSeq: le.Uint64(ints), ReserveSeq: le.Uint64(ints[8:]), LeaseExpiresAt: le.Uint64(ints[16:]),
			FinalSeq: le.Uint64(ints[24:]), Generated: ints[32] == 1, Idempotent: ints[33] == 1}
		if err := fn(&row); err != nil {
			return err
		}
	}
}

// replay runs the spill files of one partition as the next level.
func (l *level) replay(part int) error {
	ev, keys := l.spill.events[part], l.spill.keys[part]
	if ev == nil {
		return nil
	}
	for _, f := range []*spillFile{ev, keys} {
		if f == nil {
			continue
		}
		if err := f.w.Flush(); err != nil {
			return fmt.Errorf("spill key states: %w", err)
		}
		if _, err := f.f.Seek(0, io.SeekStart); err != nil {
			return fmt.Errorf("spill key states: %w", err)
		}
	}
	st, err := ev.f.Stat()
	if err != nil {
		return fmt.Errorf("spill key states: %w", err)
	}
	// The next level's table is sized for its keys: at most one per
	// event, and in a ledger whose keys table is whole, about one per
	// keys row (a reserve and a commit make two events). Fewer would
	// only make it grow.
	rows := l.spill.rows[part]
	next, err := l.p.newLevel(l.n+1, min(uint64(st.Size()/eventBytes), rows+rows/8+1024))
	if err != nil {
		return err
	}
	defer func() {
		if next.table != nil {
			next.table.release()
		}
	}()
	r := bufio.NewReaderSize(ev.f, 64<<10)
	var b [eventBytes]byte
	var e event
	for {
		if err := l.p.ctx.Err(); err != nil {
			return err
		}
		if _, err := io.ReadFull(r, b[:]); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return fmt.Errorf("read spilled receipts: %w", err)
		}
		e.get(b[:])
		if err := next.add(&e, nil); err != nil {
			return err
		}
	}
	return next.finish(func(fn func(*ledger.KeyRecord) error) error {
		if keys == nil {
			return nil
		}
		return readKeys(bufio.NewReaderSize(keys.f, 64<<10), fn)
	})
}

// spillDir returns the temporary directory of the spill files, made on
// first use.
func (p *singlePass) spillDir() (string, error) {
	if p.dir == "" {
		dir, err := os.MkdirTemp("", "ledger-verify-*")
		if err != nil {
			return "", err
		}
		p.dir = dir
	}
	return p.dir, nil
}

// cleanup removes the spill directory, if one was made.
func (p *singlePass) cleanup() {
	if p.dir != "" {
		_ = os.RemoveAll(p.dir)
	}
}
