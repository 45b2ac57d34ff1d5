package archive

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/mod/sumdb/note"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// Checked is a segment that Check found whole.
type Checked struct {
	Manifest
	// Hashes are the receipts' chain hashes, From first.
	Hashes []chain.Hash
	// Tree is the checkpoint the segment's tree was proved against;
	// Signers the ids of the keys whose signatures on it verified (none
	// when Check was given no verifier key: the checkpoint then proves
	// nothing beyond the segment's own consistency).
	Tree    tlog.Checkpoint
	Signers []string
}

// Check reads the segment directory dir and checks it alone: the
// manifest, each receipt's hash recomputed from its fields (SPEC §2) and
// chained from the manifest's prev_hash in seq order, both files'
// digests and counts, each payload opening its receipt's commitment
// (§14), and every receipt's leaf in the tree of the manifest's
// checkpoint (the manifest's frontier and the receipts give the root at
// size Through, which the consistency proof ties to the checkpoint).
// With verifier keys vs the checkpoint's signature and origin are
// checked too. A fault wraps ErrInvalid; a missing directory or file
// wraps fs.ErrNotExist.
func Check(dir string, vs []note.Verifier) (*Checked, error) {
	m, err := readManifest(dir)
	if err != nil {
		return nil, err
	}
	leaves, err := tlog.NewFrontier(int64(m.From-1), tlog.FromHex(m.Frontier))
	if err != nil {
		return nil, invalid("frontier: %v", err)
	}
	prev, err := chain.ParseHash(m.PrevHash)
	if err != nil {
		return nil, invalid("prev_hash: %v", err)
	}
	out := &Checked{Manifest: *m}
	rf, err := openLines(filepath.Join(dir, ReceiptsFile))
	if err != nil {
		return nil, err
	}
	defer rf.close()
	pf, err := openLines(filepath.Join(dir, PayloadsFile))
	if err != nil {
		return nil, err
	}
	defer pf.close()
	next, payloads, last := m.From, uint64(0), Payload{}
	pending, err := nextPayload(pf, &last)
	if err != nil {
		return nil, err
	}
	for {
		line, err := rf.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		var r chain.Receipt
		if err := json.Unmarshal(line, &r); err != nil {
			return nil, invalid("receipt line %d: %v", next-m.From+1, err)
		}
		switch {
		case len(r.Malformed) > 0 || r.Open != nil:
			return nil, invalid("receipt %d is not in chain form", r.Seq)
		case r.Seq != next:
			return nil, invalid("receipt %d where %d was expected", r.Seq, next)
		case r.PrevHash != prev:
			return nil, invalid("receipt %d: prev_hash %s does not continue the chain (%s)", r.Seq, r.PrevHash, prev)
		}
		if err := r.Check(); err != nil {
			return nil, invalid("receipt %d: %v", r.Seq, err)
		}
		for pending != nil && pending.Seq == r.Seq {
			if err := openCommitment(&r, pending); err != nil {
				return nil, err
			}
			payloads++
			if pending, err = nextPayload(pf, &last); err != nil {
				return nil, err
			}
		}
		if pending != nil && pending.Seq < r.Seq {
			return nil, invalid("payload %s of receipt %d is out of order", pending.Field, pending.Seq)
		}
		leaves.Append(r.Hash)
		out.Hashes = append(out.Hashes, r.Hash)
		prev, next = r.Hash, next+1
	}
	switch {
	case pending != nil:
		return nil, invalid("payload %s of receipt %d is outside the segment", pending.Field, pending.Seq)
	case next-1 != m.Through:
		return nil, invalid("receipts end at %d, the manifest says %d", next-1, m.Through)
	case digest(rf.sum.Sum(nil)) != m.Digest:
		return nil, invalid("%s does not match the manifest's digest", ReceiptsFile)
	case digest(pf.sum.Sum(nil)) != m.PayloadsDigest || payloads != m.Payloads:
		return nil, invalid("%s does not match the manifest's digest and count", PayloadsFile)
	}
	if out.Tree, out.Signers, err = checkpoint(m, vs); err != nil {
		return nil, err
	}
	if out.Tree.Size < int64(m.Through) {
		return nil, invalid("checkpoint of size %d does not cover receipt %d", out.Tree.Size, m.Through)
	}
	if err := tlog.CheckConsistency(tlog.FromHex(m.Consistency), out.Tree.Size, out.Tree.Root, int64(m.Through), leaves.Root()); err != nil {
		return nil, invalid("the receipts are not the tree of the checkpoint: %v", err)
	}
	return out, nil
}

// readManifest reads and checks dir's manifest.json.
func readManifest(dir string) (*Manifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		return nil, fmt.Errorf("segment %s: %w", dir, err)
	}
	var m Manifest
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&m); err != nil {
		return nil, invalid("%s: %v", ManifestFile, err)
	}
	switch {
	case m.Version != Version:
		return nil, invalid("%s: version %d, want %d", ManifestFile, m.Version, Version)
	case !validName(m.Namespace):
		return nil, invalid("%s: namespace %q", ManifestFile, m.Namespace)
	case m.From == 0 || m.Through < m.From || m.Receipts != m.Through-m.From+1:
		return nil, invalid("%s: from %d, through %d and %d receipts do not agree", ManifestFile, m.From, m.Through, m.Receipts)
	}
	return &m, nil
}

// checkpoint opens the manifest's checkpoint: with keys vs, its signature
// and origin; without, its text alone.
func checkpoint(m *Manifest, vs []note.Verifier) (tlog.Checkpoint, []string, error) {
	if len(vs) > 0 {
		c, ids, err := tlog.OpenCheckpointAny([]byte(m.Checkpoint), vs, m.Namespace)
		if err != nil {
			return c, nil, invalid("checkpoint: %v", err)
		}
		return c, ids, nil
	}
	c, err := tlog.ParseCheckpoint(tlog.NoteText([]byte(m.Checkpoint)))
	if err == nil && !strings.HasSuffix(c.Origin, "/"+m.Namespace) {
		err = fmt.Errorf("origin %q is not namespace %q's", c.Origin, m.Namespace)
	}
	if err != nil {
		return c, nil, invalid("checkpoint: %v", err)
	}
	return c, nil, nil
}

// openCommitment checks that p opens the commitment in its field of r.
func openCommitment(r *chain.Receipt, p *Payload) error {
	f, ok := chain.ParsePayloadField(p.Field)
	if !ok {
		return invalid("payload of receipt %d names field %q", p.Seq, p.Field)
	}
	salt, err := chain.ParseSalt(p.Salt)
	if err != nil {
		return invalid("payload %s of receipt %d: %v", p.Field, p.Seq, err)
	}
	if c := r.Field(f); !chain.IsCommitment(c) || chain.Commit(f, salt, p.Value) != c {
		return invalid("payload %s of receipt %d does not open its commitment", p.Field, p.Seq)
	}
	return nil
}

// nextPayload reads the next line of payloads.jsonl (nil at its end),
// which must come after last in seq and field order.
func nextPayload(pf *lines, last *Payload) (*Payload, error) {
	line, err := pf.next()
	if err == io.EOF {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var p Payload
	d := json.NewDecoder(bytes.NewReader(line))
	d.DisallowUnknownFields()
	if err := d.Decode(&p); err != nil {
		return nil, invalid("%s: %v", PayloadsFile, err)
	}
	if !payloadAfter(p, *last) {
		return nil, invalid("payload %s of receipt %d is out of order", p.Field, p.Seq)
	}
	*last = p
	return &p, nil
}

// lines reads a segment file a line at a time, summing its bytes.
type lines struct {
	f   *os.File
	r   *bufio.Reader
	sum hash.Hash
}

func openLines(path string) (*lines, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("segment: %w", err)
	}
	return &lines{f: f, r: bufio.NewReaderSize(f, 1<<16), sum: sha256.New()}, nil
}

// next returns the next line without its newline, or io.EOF. A last line
// without a newline, or one over MaxLine, is a fault.
func (l *lines) next() ([]byte, error) {
	var line []byte
	for {
		chunk, err := l.r.ReadSlice('\n')
		line = append(line, chunk...)
		switch {
		case len(line) > MaxLine:
			return nil, invalid("%s: a line is longer than %d bytes", filepath.Base(l.f.Name()), MaxLine)
		case err == nil:
			l.sum.Write(line)
			return line[:len(line)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err == io.EOF && len(line) > 0:
			return nil, invalid("%s does not end in a newline", filepath.Base(l.f.Name()))
		case err == io.EOF:
			return nil, io.EOF
		default:
			return nil, fmt.Errorf("segment: %w", err)
		}
	}
}

func (l *lines) close() { _ = l.f.Close() }
