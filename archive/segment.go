// Package archive is the segment format of SPEC §16: a namespace's
// receipts from one seq through another, written to a directory before
// their bodies are pruned from the ledger, with everything needed to check
// them alone — the chain hash they continue, the tree they belong to and
// a signed checkpoint proving it. A segment directory holds three files:
//
//	receipts.jsonl   one receipt a line, its JSON form (§2, §9.1) in RFC 8785
//	                 canonical form, payload fields in chain form (pc1:…)
//	payloads.jsonl   the values and salts still present (§14), one field a
//	                 line, in seq and field order
//	manifest.json    what ties them to the log (Manifest)
//
// The package holds no storage: Writer takes the receipts and payloads
// in order, Check reads a directory back. Nothing in it trusts the
// ledger the segment came from.
package archive

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/effect-ledger/effect-ledger/tlog"
)

// The files of a segment directory.
const (
	ManifestFile = "manifest.json"
	ReceiptsFile = "receipts.jsonl"
	PayloadsFile = "payloads.jsonl"
)

// Version is the manifest's version.
const Version = 1

// MaxLine bounds one line of a segment's files when it is read back.
const MaxLine = 8 << 20

// Manifest ties a segment to its namespace's chain and Merkle tree.
type Manifest struct {
	Version   int    `json:"version"`
	Namespace string `json:"namespace"`
	From      uint64 `json:"from"`
	Through   uint64 `json:"through"`
	// PrevHash is the chain hash of receipt From-1 (zeros for From 1):
	// the first receipt's prev_hash.
	PrevHash string `json:"prev_hash"`
	// Frontier holds the roots of the complete subtrees of the first
	// From-1 leaves, largest first (tlog.FrontierNodes): with the
	// segment's own leaves they give the tree's root at size Through.
	Frontier []tlog.HexHash `json:"frontier"`
	// Receipts is the number of receipts, Digest the SHA-256 of
	// receipts.jsonl's bytes ("sha256:<hex>").
	Receipts uint64 `json:"receipts"`
	Digest   string `json:"digest"`
	// Payloads and PayloadsDigest are the same for payloads.jsonl; an
	// erasure (§14) rewrites that file and these two.
	Payloads       uint64 `json:"payloads"`
	PayloadsDigest string `json:"payloads_digest"`
	// Checkpoint is a signed checkpoint (note text) of size ≥ Through,
	// Consistency the proof that the tree of size Through is a prefix of
	// it.
	Checkpoint  string         `json:"checkpoint"`
	Consistency []tlog.HexHash `json:"consistency"`
}

// Name is the segment directory's name: "<ns>-<from>-<through>".
func Name(ns string, from, through uint64) string {
	return ns + "-" + strconv.FormatUint(from, 10) + "-" + strconv.FormatUint(through, 10)
}

// Name is m's directory name.
func (m *Manifest) Name() string { return Name(m.Namespace, m.From, m.Through) }

// Payload is one line of payloads.jsonl: the value and salt of a
// committed field of receipt Seq.
type Payload struct {
	Seq   uint64 `json:"seq"`
	Field string `json:"field"`
	Value string `json:"value"`
	Salt  string `json:"salt"`
}

// ErrInvalid is the parent of every fault Check finds in a segment.
var ErrInvalid = errors.New("segment invalid")

// invalid is an ErrInvalid fault of the segment at dir.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// digest is the text of a SHA-256 sum as the manifest writes it.
func digest(sum []byte) string { return "sha256:" + fmt.Sprintf("%x", sum) }

// validName reports whether ns can name a segment (no path separator, no
// leading dot).
func validName(ns string) bool {
	return ns != "" && !strings.ContainsAny(ns, `/\`) && !strings.HasPrefix(ns, ".")
}
