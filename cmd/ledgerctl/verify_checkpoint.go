package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"

	"golang.org/x/mod/sumdb/note"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/tlog"
	"github.com/effect-ledger/effect-ledger/verify"
)

// checkpointFlags are verify's --checkpoint and --vkey.
type checkpointFlags struct {
	checkpoint string
	vkeys      listFlag
}

func (f *checkpointFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.checkpoint, "checkpoint", "", "check the chain against this signed checkpoint: a `FILE` or an http(s) URL (e.g. SERVER/log/default/checkpoint)")
	fs.Var(&f.vkeys, "vkey", "the log's verifier `key` for --checkpoint, --segment or --segments, and with --server for the checkpoint that proves a pruned namespace's last pruned hash (as ledgerctl keygen prints it), or a file holding it; repeatable (any one suffices). With --state, the keys the state file trusts (learnt from key receipts) are used too")
}

// load reads the checkpoint, the verifier keys and the state file's
// checkpoint and keys; nil without --checkpoint. segments: --vkey may go
// without --checkpoint (for the segments' checkpoints).
func (f *checkpointFlags) load(ctx context.Context, fs *flag.FlagSet, env *Env, src *sourceFlags, stateFile string, segments bool) (*verify.CheckpointCheck, error) {
	if f.checkpoint == "" {
		if len(f.vkeys) > 0 && !segments && src.server == "" {
			return nil, usageErr(fs, env, "--vkey goes with --checkpoint, --segment, --segments or --server")
		}
		return nil, nil
	}
	trust := &verify.KeyTrust{}
	if stateFile != "" {
		kept, err := verify.ReadStateKeys(stateFile)
		if err != nil {
			return nil, err
		}
		if kept != nil {
			trust = kept
		}
	}
	for _, s := range f.vkeys {
		text, err := readKeyText(s)
		if err == nil {
			_, err = tlog.NewVerifier(text)
		}
		if err != nil {
			return nil, usageErr(fs, env, "--vkey: %v", err)
		}
		if !slices.Contains(trust.Current, text) && !slices.Contains(trust.Retired, text) {
			trust.Current = append(trust.Current, text) // a retired key stays retired
		}
	}
	if len(trust.Current) == 0 {
		return nil, usageErr(fs, env, "--checkpoint needs --vkey (or a --state file that keeps the keys)")
	}
	note, err := readCheckpoint(ctx, f.checkpoint, src.token)
	if err != nil {
		return nil, fmt.Errorf("--checkpoint: %w", err)
	}
	cc := &verify.CheckpointCheck{Note: note, Trust: trust, Namespace: src.ns()}
	if stateFile != "" {
		if cc.Previous, err = verify.ReadStateCheckpoint(stateFile); err != nil {
			return nil, err
		}
	}
	return cc, nil
}

// readVerifier parses with parse (tlog.NewVerifier, or
// tlog.NewCosignatureVerifier for a witness) a verifier key given inline
// or in a file.
func readVerifier(s string, parse func(string) (note.Verifier, error)) (note.Verifier, error) {
	text, err := readKeyText(s)
	if err != nil {
		return nil, err
	}
	return parse(text)
}

// readKeyText returns a verifier key given inline or in a file.
func readKeyText(s string) (string, error) {
	if fi, err := os.Stat(s); err == nil && !fi.IsDir() || !strings.Contains(s, "+") {
		b, err := os.ReadFile(s)
		if err != nil {
			return "", err
		}
		s = strings.TrimSpace(string(b))
	}
	return s, nil
}

// readCheckpoint reads a signed note from a file or an http(s) URL.
func readCheckpoint(ctx context.Context, from, token string) ([]byte, error) {
	if !strings.HasPrefix(from, "http://") && !strings.HasPrefix(from, "https://") {
		return os.ReadFile(from)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, from, nil)
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = res.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", from, res.Status)
	}
	return b, nil
}

// checkCheckpoint runs cc on st and adds its violations to rep; it
// returns the checkpoint and the keys to keep in the state file.
func checkCheckpoint(ctx context.Context, cc *verify.CheckpointCheck, st store, rep *verify.Report) ([]byte, *verify.KeyTrust, error) {
	switch s := st.(type) {
	case fileStore:
		cc.Prover = readerProver{s.kept()}
		cc.Covering = s.FirstCheckpointCovering
		cc.Pruned = s.Chain
	case *server:
		cc.Prover = s
		cc.Covering = s.firstCheckpointCovering
	}
	res, err := cc.Check(ctx, st)
	if err != nil {
		return nil, nil, err
	}
	if len(res.Violations) > 0 {
		rep.OK = false
		rep.ViolationsTotal += len(res.Violations)
		rep.Violations = append(rep.Violations, res.Violations...)
	}
	return res.Latest, res.Trust, nil
}

// writeState pins the head, and the latest verified checkpoint and the
// keys trusted if any.
func writeState(path string, head verify.Pin, checkpoint []byte, keys *verify.KeyTrust) error {
	if checkpoint == nil {
		// A run without --checkpoint keeps what was verified before.
		prev, err := verify.ReadStateCheckpoint(path)
		if err == nil && prev != nil {
			checkpoint = prev
			keys, err = verify.ReadStateKeys(path)
		}
		if err != nil {
			return err
		}
	}
	if checkpoint == nil {
		return verify.WriteState(path, head)
	}
	return verify.WriteStateCheckpoint(path, head, checkpoint, keys)
}

type readerProver struct{ rd ledger.ChainReader }

func (p readerProver) ConsistencyProof(ctx context.Context, from, to int64) ([]tlog.Hash, error) {
	c, err := ledger.Log{ChainReader: p.rd}.ConsistencyProof(ctx, from, to)
	if err != nil {
		return nil, err
	}
	return tlog.FromHex(c.Hashes), nil
}
