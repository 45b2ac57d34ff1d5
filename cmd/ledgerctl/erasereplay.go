package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage"
)

// replayOpts are the flags of `ledgerctl erase --replay`.
type replayOpts struct {
	file, db, ns  string
	nsGiven, json bool
	actor, reason string
}

// purgeWait bounds how long a replay on SQLite waits for its erasures to
// be purged from the file and its WAL.
const purgeWait = time.Minute

// replayedNamespace is what a replay did in one namespace of the file.
type replayedNamespace struct {
	Namespace string            `json:"namespace"`
	Absent    bool              `json:"absent,omitempty"` // no such namespace here: skipped
	Receipts  []replayedErasure `json:"receipts"`
	Count     uint64            `json:"count"`
	Skipped   []skippedItem     `json:"skipped"`
	Pending   []pendingItem     `json:"pending"`
	Purged    *bool             `json:"purged"`
}

type replayedErasure struct {
	Seq      uint64 `json:"seq"`
	Hash     string `json:"hash"`
	Replayed uint64 `json:"replays"` // the seq of the file's erasure
}

type pendingItem struct {
	Key      string `json:"key"`
	FirstSeq uint64 `json:"first_seq"`
	Status   string `json:"status"`
}

type skippedItem struct {
	Erasure uint64 `json:"erasure"`
	Seq     uint64 `json:"seq"`
	Reason  string `json:"reason"`
}

// replayErasures applies an erasures file to the ledger of o.db: the file
// is read and checked first, so a bad one changes nothing.
func replayErasures(ctx context.Context, env *Env, o replayOpts) error {
	fh, err := os.Open(o.file)
	if err != nil {
		return fmt.Errorf("erasures file: %w", err)
	}
	f, err := ledger.ParseErasureFile(fh)
	_ = fh.Close()
	if err != nil {
		return fmt.Errorf("%s: %w (nothing was changed)", o.file, err)
	}
	parts := f.Namespaces
	if o.nsGiven {
		parts = nil
		for _, p := range f.Namespaces {
			if p.Namespace == o.ns {
				parts = append(parts, p)
			}
		}
		if parts == nil {
			return fmt.Errorf("%s lists no namespace %q (nothing was changed)", o.file, o.ns)
		}
	}
	st, err := openDB(ctx, o.db, env, false)
	if err != nil {
		return err
	}
	l := ledger.New(st, ledger.Config{Logger: warnLogger(env), CanPurge: !storage.IsPostgres(o.db)})
	out, err := replayParts(ctx, l, parts, o)
	if cerr := l.Close(); err == nil && cerr != nil {
		err = storage.RedactError(o.db, fmt.Errorf("close %s: %w", storage.Describe(o.db), cerr))
	}
	if err != nil {
		return err
	}
	if o.json {
		return writeJSON(env.Stdout, map[string]any{"namespaces": out})
	}
	return printReplay(env, out)
}

// replayParts replays each namespace's part, then waits for the purge.
func replayParts(ctx context.Context, l *ledger.Ledger, parts []ledger.NamespaceErasures, o replayOpts) ([]replayedNamespace, error) {
	out := make([]replayedNamespace, 0, len(parts))
	for i := range parts {
		p := &parts[i]
		rn := replayedNamespace{Namespace: p.Namespace, Receipts: []replayedErasure{}, Skipped: []skippedItem{}, Pending: []pendingItem{}}
		n, err := l.NS(ctx, p.Namespace)
		if errors.Is(err, ledger.ErrUnknownNamespace) || ledger.ErrorCode(err) == ledger.ECodeUnknownNamespace {
			rn.Absent = true
			out = append(out, rn)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("namespace %s: %w", p.Namespace, err)
		}
		res, err := n.ReplayErasures(ctx, p, o.actor, o.reason)
		if err != nil {
			return nil, fmt.Errorf("namespace %s: %w", p.Namespace, err)
		}
		for _, r := range res.Receipts {
			rn.Receipts = append(rn.Receipts, replayedErasure{Seq: r.Seq, Hash: r.Hash.String(), Replayed: res.Replayed[r.Seq]})
		}
		rn.Count = res.Count
		for _, pm := range res.Pending {
			rn.Pending = append(rn.Pending, pendingItem{Key: pm.Key, FirstSeq: pm.FirstSeq, Status: pm.Status})
		}
		for _, it := range res.Skipped() {
			rn.Skipped = append(rn.Skipped, skippedItem{Erasure: it.Erasure, Seq: it.Seq, Reason: it.Status})
		}
		if len(res.Receipts) > 0 {
			purged, err := waitPurged(ctx, n, res.Receipts)
			if err != nil {
				return nil, fmt.Errorf("namespace %s: %w", p.Namespace, err)
			}
			rn.Purged = n.PurgedAnswer(purged)
		}
		out = append(out, rn)
	}
	return out, nil
}

// waitPurged waits until the file and its WAL are rid of the values the
// receipts erased (SQLite: the ledger's checkpointer marks each erasure
// purged), for at most purgeWait; it reports whether they are. A store
// that cannot tell (PostgreSQL) answers at once.
func waitPurged(ctx context.Context, n *ledger.Namespace, rs []ledger.ReceiptRef) (bool, error) {
	if n.PurgedAnswer(false) == nil {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, purgeWait)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for _, r := range rs {
		for {
			e, _, err := n.Erasure(ctx, r.Seq)
			if err != nil {
				return false, err
			}
			if e.PurgedAt > 0 {
				break
			}
			select {
			case <-ctx.Done():
				return false, nil
			case <-tick.C:
			}
		}
	}
	return true, nil
}

// printReplay prints what a replay did, namespace by namespace.
func printReplay(env *Env, out []replayedNamespace) error {
	var b strings.Builder
	for _, rn := range out {
		switch {
		case rn.Absent:
			fmt.Fprintf(&b, "%s: no such namespace here, skipped\n", rn.Namespace)
			continue
		case len(rn.Receipts) == 0:
			fmt.Fprintf(&b, "%s: nothing to erase\n", rn.Namespace)
		default:
			fmt.Fprintf(&b, "%s: erased the payloads of %s\n", rn.Namespace, plural(rn.Count, "receipt", "receipts"))
			for _, r := range rn.Receipts {
				fmt.Fprintf(&b, "  erase receipt %d:%s replays erasure %d\n", r.Seq, r.Hash, r.Replayed)
			}
		}
		for _, s := range rn.Skipped {
			why := "another receipt is at that seq here"
			if s.Reason == ledger.ReplayAbsent {
				why = "no receipt at that seq here"
			}
			fmt.Fprintf(&b, "  skipped seq %d (erasure %d): %s\n", s.Seq, s.Erasure, why)
		}
		for _, pm := range rn.Pending {
			switch pm.Status {
			case ledger.ReplayMarked:
				fmt.Fprintf(&b, "  pending: %s (reserved at %d) is in flight; its outcome will be erased as it is recorded\n", pm.Key, pm.FirstSeq)
			case ledger.ReplayAbsent, ledger.ReplayHashMismatch, ledger.ReplayFinal:
				fmt.Fprintf(&b, "  pending mark of %s (reserved at %d) skipped: %s\n", pm.Key, pm.FirstSeq, strings.ReplaceAll(pm.Status, "_", " "))
			}
		}
		if rn.Purged != nil && !*rn.Purged {
			fmt.Fprintf(&b, "  not purged yet: the next start of ledgerd purges the WAL\n")
		}
	}
	_, err := fmt.Fprint(env.Stdout, b.String())
	return err
}
