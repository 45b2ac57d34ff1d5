package archive

import (
	"bufio"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/effect-ledger/effect-ledger/chain"
)

// Erasure (SPEC §14) of archived values: an erase of receipts whose
// bodies were pruned rewrites their segment's payloads.jsonl without the
// erased lines, then the manifest's payloads count and digest. Each file
// is replaced by a temporary one, fsynced and renamed; a crash between the
// two renames leaves a manifest that does not match its payloads, which a
// rerun of ErasePayloads mends (it always rewrites the manifest from the
// file it leaves).

// Receipts calls fn with each receipt of the segment at dir, in seq order,
// without checking the segment (Check does).
func Receipts(dir string, fn func(*chain.Receipt) error) error {
	rf, err := openLines(filepath.Join(dir, ReceiptsFile))
	if err != nil {
		return err
	}
	defer rf.close()
	for {
		line, err := rf.next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		var r chain.Receipt
		if err := json.Unmarshal(line, &r); err != nil {
			return invalid("%s: %v", ReceiptsFile, err)
		}
		if err := fn(&r); err != nil {
			return err
		}
	}
}

// Payloads calls fn with each line of the segment's payloads.jsonl.
func Payloads(dir string, fn func(*Payload) error) error {
	pf, err := openLines(filepath.Join(dir, PayloadsFile))
	if err != nil {
		return err
	}
	defer pf.close()
	last := Payload{}
	for {
		p, err := nextPayload(pf, &last)
		if err != nil || p == nil {
			return err
		}
		if err := fn(p); err != nil {
			return err
		}
	}
}

// Holds reports whether the segment at dir still holds a value that
// erase names (fields by receipt seq).
func Holds(dir string, erase map[uint64]chain.FieldSet) (bool, error) {
	errFound := errors.New("found")
	err := Payloads(dir, func(p *Payload) error {
		if named(erase, p) {
			return errFound
		}
		return nil
	})
	if errors.Is(err, errFound) {
		return true, nil
	}
	return false, err
}

// named reports whether erase names p's field of its receipt.
func named(erase map[uint64]chain.FieldSet, p *Payload) bool {
	set, ok := erase[p.Seq]
	if !ok {
		return false
	}
	f, ok := chain.ParsePayloadField(p.Field)
	return ok && set.Has(f)
}

// ErasePayloads removes from the segment at dir the values erase names
// and rewrites its manifest; it reports whether it removed any. The
// receipts, their digest and the checkpoint stay as they are.
func ErasePayloads(dir string, erase map[uint64]chain.FieldSet) (bool, error) {
	m, err := readManifest(dir)
	if err != nil {
		return false, err
	}
	tmp, err := os.CreateTemp(dir, "."+PayloadsFile+".*")
	if err != nil {
		return false, fmt.Errorf("segment: %w", err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	w := bufio.NewWriterSize(tmp, 1<<16)
	sum := sha256.New()
	var kept uint64
	removed := false
	err = Payloads(dir, func(p *Payload) error {
		if named(erase, p) {
			removed = true
			return nil
		}
		b, err := marshalCanonical(*p)
		if err != nil {
			return err
		}
		b = append(b, '\n')
		sum.Write(b)
		kept++
		_, err = w.Write(b)
		return err
	})
	if err == nil {
		err = w.Flush()
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, fmt.Errorf("erase payloads of segment %s: %w", dir, err)
	}
	if removed {
		if err := os.Rename(tmp.Name(), filepath.Join(dir, PayloadsFile)); err != nil {
			return false, fmt.Errorf("erase payloads of segment %s: %w", dir, err)
		}
	}
	if d := digest(sum.Sum(nil)); removed || m.PayloadsDigest != d || m.Payloads != kept {
		m.Payloads, m.PayloadsDigest = kept, d
		if err := writeManifest(dir, m); err != nil {
			return false, err
		}
	}
	return removed, syncDir(dir)
}
