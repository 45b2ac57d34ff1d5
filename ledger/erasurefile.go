package ledger

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/effect-ledger/effect-ledger/chain"
)

// The erasures file (SPEC §14, docs/privacy.md): what `ledgerctl erasures
// export` writes and `ledgerctl erase --replay` reads, so that a backup
// taken before an erasure can be erased too once it is restored. It lists,
// per namespace and per erase receipt, each erased receipt by seq and
// chain hash with the fields erased, and the MACs of the subjects erased.
// It holds no value, but it says which receipts were erased together and
// the subjects' MACs: it is as confidential as the erasure table it comes
// from (admins only).

// ErasureFileFormat is the value of the file's "format" member; a file of
// another format is refused.
const ErasureFileFormat = "effect-ledger/erasures/v1"

// MaxErasureFile bounds the size of an erasures file a replay reads.
const MaxErasureFile = 256 << 20

// ErasureFile is an erasures file.
type ErasureFile struct {
	Format     string              `json:"format"`
	ExportedAt uint64              `json:"exported_at"` // unix ms
	Namespaces []NamespaceErasures `json:"namespaces"`
}

// NamespaceErasures are the erasures of one namespace, in seq order of
// their erase receipts, and its pending marks. It is also the answer of
// GET /v1/ns/{ns}/erasures.
type NamespaceErasures struct {
	Namespace string          `json:"namespace"`
	Erasures  []ErasureRecord `json:"erasures"`
	Pending   []PendingRecord `json:"pending"`
}

// PendingRecord is a pending mark of the exporting ledger: a key
// generation an erase selected while it was in flight, by key, the seq
// and chain hash (hex) of the reserve that started it, the erase that
// marked it (0: one that erased nothing) and the fields to erase when it
// is finalized.
type PendingRecord struct {
	Key      string   `json:"key"`
	FirstSeq uint64   `json:"first_seq"`
	Hash     string   `json:"hash"`
	EraseSeq uint64   `json:"erase_seq"`
	Fields   []string `json:"fields"`
}

// ErasureRecord is one erase receipt of the exporting ledger: its seq and
// chain hash, the fields it names (its result's), whether a retention
// sweep appended it, the MACs (hex) of the subjects it was asked for, and
// each receipt whose values it erased.
type ErasureRecord struct {
	Seq       uint64         `json:"seq"`
	Hash      string         `json:"hash"`
	Fields    []string       `json:"fields"`
	Retention bool           `json:"retention"`
	Subjects  []string       `json:"subjects"`
	Erased    []ErasedRecord `json:"erased"`
}

// ErasedRecord is one receipt an erasure erased: its seq, its chain hash
// (hex) and the fields whose values that erasure deleted.
type ErasedRecord struct {
	Seq    uint64   `json:"seq"`
	Hash   string   `json:"hash"`
	Fields []string `json:"fields"`
}

// ErrBadErasureFile: an erasures file that does not parse or breaks a rule
// of its format; the message says where.
var ErrBadErasureFile = errors.New("bad erasures file")

// ParseErasureFile reads and checks an erasures file: exactly the members
// of the format, format ErasureFileFormat, valid and distinct namespace
// names, pending marks of valid keys and distinct generations, erase receipts in increasing seq order, each with its fields
// payload field names in canonical order, subject MACs of 64 lowercase
// hex digits without repeats, and erased receipts in increasing seq
// order below the erase receipt's, each with 64-hex chain hash and a
// non-empty subset of the erasure's fields in canonical order. Errors
// wrap ErrBadErasureFile.
func ParseErasureFile(r io.Reader) (*ErasureFile, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxErasureFile+1))
	if err != nil {
		return nil, fmt.Errorf("read erasures file: %w", err)
	}
	if len(data) > MaxErasureFile {
		return nil, fmt.Errorf("%w: larger than %d bytes", ErrBadErasureFile, MaxErasureFile)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f ErasureFile
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadErasureFile, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: text after the document", ErrBadErasureFile)
	}
	if err := f.check(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadErasureFile, err)
	}
	return &f, nil
}

func (f *ErasureFile) check() error {
	if f.Format != ErasureFileFormat {
		return fmt.Errorf("format %q: want %q", f.Format, ErasureFileFormat)
	}
	if f.Namespaces == nil {
		return errors.New(`"namespaces" is missing`)
	}
	seen := map[string]bool{}
	for i := range f.Namespaces {
		ns := &f.Namespaces[i]
		if !ValidNamespace(ns.Namespace) {
			return fmt.Errorf("namespaces[%d]: %q is not a namespace name", i, ns.Namespace)
		}
		if seen[ns.Namespace] {
			return fmt.Errorf("namespace %s is listed twice", ns.Namespace)
		}
		seen[ns.Namespace] = true
		if err := ns.check(); err != nil {
			return fmt.Errorf("namespace %s: %w", ns.Namespace, err)
		}
	}
	return nil
}

func (ns *NamespaceErasures) check() error {
	if ns.Erasures == nil || ns.Pending == nil {
		return errors.New(`"erasures" and "pending" are required (empty arrays when none)`)
	}
	seen := map[Generation]bool{}
	for i := range ns.Pending {
		p := &ns.Pending[i]
		g := Generation{Key: p.Key, FirstSeq: p.FirstSeq}
		switch {
		case ValidateKey(p.Key) != nil || len(p.Key) < MinKeyLen:
			return fmt.Errorf("pending[%d]: not an idempotency key", i)
		case p.FirstSeq == 0:
			return fmt.Errorf("pending[%d]: first_seq must be at least 1", i)
		case seen[g]:
			return fmt.Errorf("pending[%d]: the generation is listed twice", i)
		}
		seen[g] = true
		if _, err := chain.ParseHash(p.Hash); err != nil || !isLowerHexText(p.Hash) {
			return fmt.Errorf("pending[%d]: hash: want 64 lowercase hex digits", i)
		}
		if _, err := canonicalFields(p.Fields); err != nil {
			return fmt.Errorf("pending[%d]: %w", i, err)
		}
	}
	var last uint64
	for i := range ns.Erasures {
		e := &ns.Erasures[i]
		if e.Seq <= last {
			return fmt.Errorf("erasures[%d]: seq %d is not above the previous one", i, e.Seq)
		}
		last = e.Seq
		if err := e.check(); err != nil {
			return fmt.Errorf("erasure %d: %w", e.Seq, err)
		}
	}
	return nil
}

func (e *ErasureRecord) check() error {
	if _, err := chain.ParseHash(e.Hash); err != nil || !isLowerHexText(e.Hash) {
		return errors.New("hash: want 64 lowercase hex digits")
	}
	set, err := canonicalFields(e.Fields)
	if err != nil {
		return err
	}
	if e.Subjects == nil || e.Erased == nil {
		return errors.New(`"subjects" and "erased" are required (empty arrays when none)`)
	}
	if _, err := parseMACs(e.Subjects); err != nil {
		return err
	}
	var last uint64
	for i := range e.Erased {
		x := &e.Erased[i]
		switch {
		case x.Seq <= last:
			return fmt.Errorf("erased[%d]: seq %d is not above the previous one", i, x.Seq)
		case x.Seq >= e.Seq:
			return fmt.Errorf("erased[%d]: seq %d is not below the erase receipt's", i, x.Seq)
		}
		last = x.Seq
		if _, err := chain.ParseHash(x.Hash); err != nil || !isLowerHexText(x.Hash) {
			return fmt.Errorf("erased seq %d: hash: want 64 lowercase hex digits", x.Seq)
		}
		fs, err := canonicalFields(x.Fields)
		if err != nil {
			return fmt.Errorf("erased seq %d: %w", x.Seq, err)
		}
		if fs&^set != 0 {
			return fmt.Errorf("erased seq %d: fields %v are not all among the erasure's %v", x.Seq, x.Fields, e.Fields)
		}
	}
	return nil
}

// canonicalFields parses names: payload field names, at least one, in
// canonical order without repeats.
func canonicalFields(names []string) (chain.FieldSet, error) {
	var set chain.FieldSet
	for _, n := range names {
		f, ok := chain.ParsePayloadField(n)
		if !ok {
			return 0, fmt.Errorf("fields: %q is not a payload field", n)
		}
		set = set.With(f)
	}
	if len(names) == 0 || !slices.Equal(set.Names(), names) {
		return 0, errors.New("fields: want payload field names (external_ref, result, error_message, note) in that order, at least one")
	}
	return set, nil
}

// parseMACs parses subject MACs in lowercase hex, without repeats.
func parseMACs(texts []string) ([]SubjectMAC, error) {
	out := make([]SubjectMAC, 0, len(texts))
	seen := map[string]bool{}
	for _, s := range texts {
		var m SubjectMAC
		if len(s) != 2*len(m) || !isLowerHexText(s) {
			return nil, errors.New("subjects: want MACs of 64 lowercase hex digits")
		}
		if seen[s] {
			return nil, errors.New("subjects: a MAC is listed twice")
		}
		seen[s] = true
		if _, err := hex.Decode(m[:], []byte(s)); err != nil {
			return nil, fmt.Errorf("subjects: %w", err)
		}
		out = append(out, m)
	}
	return out, nil
}

func isLowerHexText(s string) bool {
	for _, c := range []byte(s) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// macTexts is the MACs in lowercase hex, never nil.
func macTexts(ms []SubjectMAC) []string {
	out := make([]string, 0, len(ms))
	for _, m := range ms {
		out = append(out, hex.EncodeToString(m[:]))
	}
	return out
}
