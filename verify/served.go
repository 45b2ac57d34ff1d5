package verify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"golang.org/x/mod/sumdb/note"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// A server's pruned namespace (SPEC §16) lists its receipts from P+1 on:
// GET /v1/head says P, the chain hash of receipt P and the latest prune
// receipt. The verifier does not take that hash on the server's word: one
// inclusion proof of leaf P-1 binds it into a checkpoint, signed by a key
// of --vkey when given, else the latest one the server serves. The chain
// pass then starts at P from that hash, and the state checks, the gate and
// the audit at P+1, as on a database whose bodies ≤ P are deleted
// (pruned.go).

// ServedPrune is a server's pruned prefix with the proof of its hash.
type ServedPrune struct {
	Through uint64     // P: receipts 1…P are pruned
	Hash    chain.Hash // the chain hash of receipt P, as the server says
	Prune   uint64     // the latest prune receipt, which prunes through P
	// Checkpoint is the signed note the proof is against: the latest
	// the server serves, in namespace Namespace.
	Checkpoint []byte
	Namespace  string
	Proof      tlog.InclusionProof // of receipt P in the checkpoint's tree
}

// PrunedProof says how a run over a server's pruned namespace bound the
// hash of receipt P, from which its chain pass started (Report.Pruned).
type PrunedProof struct {
	Through  uint64 `json:"through"`
	Hash     string `json:"hash"`
	TreeSize int64  `json:"tree_size"`
	// Signed: the checkpoint's signature was checked with a key given
	// (Opts.Keys); false: it is the latest checkpoint the server serves,
	// its signature unchecked.
	Signed bool `json:"signed"`
	Proven bool `json:"proven"` // the inclusion proof verified
}

// Pruned reads the pruned prefix of the client's namespace from GET
// /v1/head, with the latest checkpoint and the inclusion proof of receipt
// P in it; nil when nothing is pruned.
func (s Server) Pruned(ctx context.Context) (*ServedPrune, error) {
	p, err := s.Client.PrunedPrefix(ctx)
	if err != nil || p == nil {
		return nil, ServerErr(err)
	}
	h, err := chain.ParseHash(p.Hash)
	if err != nil {
		return nil, fmt.Errorf("head: pruned.hash: %w", err)
	}
	cp, err := s.Client.Checkpoint(ctx)
	if err != nil {
		return nil, fmt.Errorf("the checkpoint to prove pruned receipt %d in: %w", p.Through, ServerErr(err))
	}
	c, err := tlog.ParseCheckpoint(tlog.NoteText(cp))
	if err != nil {
		return nil, fmt.Errorf("the served checkpoint: %w", err)
	}
	raw, err := s.Client.InclusionProof(ctx, p.Through, c.Size)
	if err != nil {
		return nil, fmt.Errorf("the inclusion proof of pruned receipt %d: %w", p.Through, ServerErr(err))
	}
	sp := &ServedPrune{Through: p.Through, Hash: h, Prune: p.Prune, Checkpoint: cp, Namespace: s.Client.Namespace()}
	if err := json.Unmarshal(raw, &sp.Proof); err != nil {
		return nil, fmt.Errorf("inclusion proof %d: decode response: %w", p.Through, err)
	}
	return sp, nil
}

// prove checks the served hash of receipt P: the checkpoint opened with a
// key of keys (checkpoint_key_unknown if none signed it), else parsed as
// served; the proof of leaf P-1 against its root (kept_hash_mismatch).
// bad is the violation, if any, that the run reports at P.
func (sp *ServedPrune) prove(keys []note.Verifier) (res *PrunedProof, bad *Violation) {
	res = &PrunedProof{Through: sp.Through, Hash: sp.Hash.String(), Signed: len(keys) > 0}
	var c tlog.Checkpoint
	var err error
	if len(keys) > 0 {
		var errs []error
		for _, k := range keys {
			if c, err = tlog.OpenCheckpoint(sp.Checkpoint, k, sp.Namespace); err == nil {
				break
			}
			errs = append(errs, err)
		}
		if err != nil {
			return res, &Violation{Seq: sp.Through, Rule: RuleCheckpointKeyUnknown, Detail: fmt.Sprintf(
				"the checkpoint the server serves, which should prove the hash of pruned receipt %d, is signed by no key given: %v", sp.Through, errors.Join(errs...))}
		}
	} else if c, err = tlog.ParseCheckpoint(tlog.NoteText(sp.Checkpoint)); err != nil {
		return res, &Violation{Seq: sp.Through, Rule: RuleKeptHashMismatch, Detail: fmt.Sprintf(
			"the checkpoint the server serves, which should prove the hash of pruned receipt %d, does not parse: %v", sp.Through, err)}
	}
	res.TreeSize = c.Size
	p := sp.Proof
	switch {
	case p.Seq != sp.Through || p.LeafIndex != tlog.LeafIndex(sp.Through) || p.TreeSize != c.Size:
		err = fmt.Errorf("%w: the server proved seq %d (leaf %d) in a tree of size %d, not receipt %d in the checkpoint's of size %d",
			tlog.ErrProof, p.Seq, p.LeafIndex, p.TreeSize, sp.Through, c.Size)
	default:
		err = tlog.CheckInclusion(tlog.FromHex(p.Hashes), c.Size, c.Root, p.LeafIndex, sp.Hash)
	}
	if err != nil {
		return res, &Violation{Seq: sp.Through, Rule: RuleKeptHashMismatch, Detail: fmt.Sprintf(
			"the server says receipts 1…%d are pruned and receipt %d has chain hash %s, but that hash is not leaf %d of the checkpoint of size %d: %v",
			sp.Through, sp.Through, sp.Hash, tlog.LeafIndex(sp.Through), c.Size, err)}
	}
	res.Proven = true
	return res, nil
}

// checkServedPrune reports a served pruned prefix that no prune receipt
// of the chain pass stands for (prune_invalid): the latest prune receipt
// the server names must prune through P.
func (p *pruned) checkServedPrune(col *collector, pr *pruneRanges) {
	sp := p.served
	for _, r := range pr.list {
		if r.Seq == sp.Prune && r.Through == sp.Through {
			return
		}
	}
	col.addf(sp.Prune, RulePruneInvalid, "the server says receipts 1…%d are pruned by receipt %d, which is not a prune receipt of the chain through %d",
		sp.Through, sp.Prune, sp.Through)
}
