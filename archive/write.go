package archive

import (
	"bufio"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/gowebpki/jcs"
	"golang.org/x/mod/sumdb/note"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// Writer writes one segment: receipts and payloads in seq order into a
// hidden temporary directory beside the segment's name; Finish makes the
// files durable, renames the directory and reads it back with Check.
// Nothing appears under the segment's name unless it is whole.
type Writer struct {
	dir, tmp string
	m        Manifest
	next     uint64
	prev     chain.Hash
	leaves   *tlog.Frontier
	files    [2]*segmentFile // receipts, payloads
	last     Payload         // the last payload written, for the order
}

type segmentFile struct {
	f   *os.File
	w   *bufio.Writer
	sum hash.Hash
}

func (s *segmentFile) line(v []byte) error {
	v = append(v, '\n')
	s.sum.Write(v)
	_, err := s.w.Write(v)
	return err
}

// Create starts the segment of namespace ns beginning at seq from in the
// archive directory dir. prev is the chain hash of receipt from-1 and
// frontier the roots of the complete subtrees of the tree's first from-1
// leaves (tlog.FrontierNodes).
func Create(dir, ns string, from uint64, prev chain.Hash, frontier []tlog.Hash) (*Writer, error) {
	if !validName(ns) || from == 0 {
		return nil, fmt.Errorf("segment of namespace %q from %d: not a segment", ns, from)
	}
	leaves, err := tlog.NewFrontier(int64(from-1), frontier)
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(dir, ".segment-*")
	if err != nil {
		return nil, fmt.Errorf("create segment: %w", err)
	}
	w := &Writer{dir: dir, tmp: tmp, next: from, prev: prev, leaves: leaves, m: Manifest{
		Version: Version, Namespace: ns, From: from, PrevHash: prev.String(), Frontier: tlog.HexHashes(frontier)}}
	for i, name := range []string{ReceiptsFile, PayloadsFile} {
		f, err := os.OpenFile(filepath.Join(tmp, name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			w.Abort()
			return nil, fmt.Errorf("create segment: %w", err)
		}
		w.files[i] = &segmentFile{f: f, w: bufio.NewWriterSize(f, 1<<16), sum: sha256.New()}
	}
	return w, nil
}

// Receipt adds the next receipt: its seq follows the last one's and its
// prev_hash is the last one's hash. r's opening, if any, is not written
// (Payload writes the values).
func (w *Writer) Receipt(r *chain.Receipt) error {
	if r.Seq != w.next || r.PrevHash != w.prev || len(r.Malformed) > 0 {
		return fmt.Errorf("segment: receipt %d does not follow receipt %d", r.Seq, w.next-1)
	}
	c := *r
	c.Open = nil
	line, err := jcs.Transform(c.AppendJSON(nil))
	if err != nil {
		return fmt.Errorf("segment: receipt %d: %w", r.Seq, err)
	}
	if err := w.files[0].line(line); err != nil {
		return fmt.Errorf("segment: %w", err)
	}
	w.leaves.Append(r.Hash)
	w.prev, w.next = r.Hash, r.Seq+1
	w.m.Receipts++
	return nil
}

// Payload adds the value and salt of field f of receipt seq, a receipt
// already added; payloads come in seq and field order.
func (w *Writer) Payload(seq uint64, f chain.PayloadField, p chain.Payload) error {
	line := Payload{Seq: seq, Field: f.Name(), Value: p.Value, Salt: p.Salt.String()}
	if seq < w.m.From || seq >= w.next || p.ErasedBy > 0 || !payloadAfter(line, w.last) {
		return fmt.Errorf("segment: payload %s of receipt %d out of order", f.Name(), seq)
	}
	b, err := marshalCanonical(line)
	if err != nil {
		return err
	}
	if err := w.files[1].line(b); err != nil {
		return fmt.Errorf("segment: %w", err)
	}
	w.last = line
	w.m.Payloads++
	return nil
}

// payloadAfter reports whether p comes after last in seq and field order.
func payloadAfter(p, last Payload) bool {
	if p.Seq != last.Seq {
		return p.Seq > last.Seq
	}
	f, _ := chain.ParsePayloadField(p.Field)
	g, ok := chain.ParsePayloadField(last.Field)
	return !ok || f > g
}

// Finish ends the segment with the receipt added last, the checkpoint
// note (size ≥ the last seq) and the consistency proof from the last seq
// to it. It writes the manifest, fsyncs the files and the directory,
// renames it to its name and checks it (Check with vs, the log's
// verifier keys). It returns the segment's path. A segment already
// there under that name (an earlier run cut short after the rename) is
// kept when it checks and holds the same receipts.
func (w *Writer) Finish(checkpoint string, consistency []tlog.Hash, vs []note.Verifier) (path string, err error) {
	defer func() {
		if err != nil {
			w.Abort()
		}
	}()
	if w.m.Receipts == 0 {
		return "", errors.New("segment: no receipts")
	}
	w.m.Through = w.next - 1
	w.m.Checkpoint, w.m.Consistency = checkpoint, tlog.HexHashes(consistency)
	for i, s := range w.files {
		if err := s.w.Flush(); err != nil {
			return "", fmt.Errorf("segment: %w", err)
		}
		if err := s.f.Sync(); err != nil {
			return "", fmt.Errorf("segment: %w", err)
		}
		if err := s.f.Close(); err != nil {
			return "", fmt.Errorf("segment: %w", err)
		}
		sum := digest(s.sum.Sum(nil))
		if i == 0 {
			w.m.Digest = sum
		} else {
			w.m.PayloadsDigest = sum
		}
	}
	w.files = [2]*segmentFile{}
	if err := writeManifest(w.tmp, &w.m); err != nil {
		return "", err
	}
	if err := syncDir(w.tmp); err != nil {
		return "", err
	}
	path = filepath.Join(w.dir, w.m.Name())
	old, err := Check(path, vs)
	switch {
	case err == nil && old.Digest == w.m.Digest && old.PayloadsDigest == w.m.PayloadsDigest:
		w.Abort()
		return path, nil
	case err == nil && old.Digest == w.m.Digest:
		// The same receipts, other values: an attempt that lost the race
		// to an erasure (SPEC §14) left it; values only ever go, so the
		// newer segment replaces it.
		if err := w.replace(path); err != nil {
			return "", err
		}
	case err == nil:
		return "", fmt.Errorf("segment %s exists with other receipts (digest %s)", path, old.Digest)
	case !errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("segment %s exists and does not check: %w", path, err)
	default:
		if err := os.Rename(w.tmp, path); err != nil {
			return "", fmt.Errorf("segment: %w", err)
		}
	}
	w.tmp = ""
	if err := syncDir(w.dir); err != nil {
		return "", err
	}
	if _, err := Check(path, vs); err != nil {
		return "", fmt.Errorf("segment %s does not read back: %w", path, err)
	}
	return path, nil
}

// replace puts the finished segment in place of the one at path: the old
// one moved aside, the new one renamed in, the old one removed.
func (w *Writer) replace(path string) error {
	aside, err := os.MkdirTemp(w.dir, ".segment-replaced-*")
	if err != nil {
		return fmt.Errorf("segment: %w", err)
	}
	if err := os.Remove(aside); err != nil {
		return fmt.Errorf("segment: %w", err)
	}
	if err := os.Rename(path, aside); err != nil {
		return fmt.Errorf("segment: %w", err)
	}
	if err := os.Rename(w.tmp, path); err != nil {
		return fmt.Errorf("segment: %w", err)
	}
	if err := syncDir(w.dir); err != nil {
		return err
	}
	return os.RemoveAll(aside)
}

// Digest is the digest of the receipts written (set by Finish).
func (w *Writer) Digest() string { return w.m.Digest }

// Abort removes the temporary directory of a segment not finished.
func (w *Writer) Abort() {
	for _, s := range w.files {
		if s != nil {
			_ = s.f.Close()
		}
	}
	if w.tmp != "" {
		_ = os.RemoveAll(w.tmp)
		w.tmp = ""
	}
}

// writeManifest writes m into dir durably: a temporary file, fsynced,
// renamed over manifest.json.
func writeManifest(dir string, m *Manifest) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("segment manifest: %w", err)
	}
	return writeFileSync(dir, ManifestFile, append(b, '\n'))
}

// writeFileSync replaces dir/name with data: a temporary file fsynced and
// renamed over it.
func writeFileSync(dir, name string, data []byte) error {
	f, err := os.CreateTemp(dir, "."+name+".*")
	if err != nil {
		return fmt.Errorf("segment: %w", err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), filepath.Join(dir, name))
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("segment: %w", err)
	}
	return nil
}

// syncDir fsyncs a directory, so that the names in it are durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("segment: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("segment: fsync %s: %w", dir, err)
	}
	return nil
}

// marshalCanonical is v's RFC 8785 form.
func marshalCanonical(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return jcs.Transform(b)
}
