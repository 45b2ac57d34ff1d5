package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/mod/sumdb/note"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// CheckProofCommand verifies portable receipts offline.
type CheckProofCommand struct{ Env *Env }

// Run runs check-proof.
func (c *CheckProofCommand) Run(_ context.Context, args []string) error {
	fs := flag.NewFlagSet("check-proof", flag.ContinueOnError)
	var vkeys listFlag
	fs.Var(&vkeys, "vkey", "the log's verifier `key` (NAME+HASH+BASE64, as ledgerctl keygen prints it), or a file holding it; repeatable (any one suffices)")
	var witnessKeys listFlag
	fs.Var(&witnessKeys, "witness-vkey", "a witness's cosignature verifier `key` (NAME+HASH+BASE64 with key type 0x04), or a file holding it; repeatable")
	quorum := fs.Int("quorum", 0, "require valid cosignatures by at least this many of the --witness-vkey witnesses (default: all of them)")
	ns := namespaceFlag(fs, ledger.DefaultNamespace, "the `namespace` the receipts must belong to: the checkpoint's origin must be the key's name, \"/\" and it")
	asJSON := jsonFlag(fs, "print JSON")
	pos, err := parse(fs, c.Env, args, checkProofUsage, checkProofExamples)
	if err != nil {
		return err
	}
	if len(pos) != 1 || len(vkeys) == 0 {
		return usageErr(fs, c.Env, "give one FILE and --vkey")
	}
	if !ledger.ValidNamespace(*ns) {
		return usageErr(fs, c.Env, "--namespace %q: names are 1–64 bytes of a-z 0-9 . _ -", *ns)
	}
	vs, err := verifiers(fs, c.Env, vkeys)
	if err != nil {
		return err
	}
	witnesses, need, err := c.witnesses(fs, witnessKeys, *quorum)
	if err != nil {
		return err
	}
	var in io.Reader = os.Stdin
	if pos[0] != "-" {
		f, err := os.Open(pos[0])
		if err != nil {
			return err
		}
		defer func() { _ = f.Close() }()
		in = f
	}
	chk := proofChecker{vs: vs, ns: *ns, witnesses: witnesses, need: need}
	var results []proofVerdict
	err = tlog.ReadPortables(in, func(raw []byte) error {
		results = append(results, chk.check(raw))
		return nil
	})
	if err != nil {
		// Data that is not a whole JSON value is no proof: a verdict, not
		// an I/O failure.
		results = append(results, proofVerdict{Error: err.Error()})
	}
	if len(results) == 0 {
		return fmt.Errorf("check-proof: %s holds no portable receipt", pos[0])
	}
	bad := 0
	for _, r := range results {
		if !r.Valid {
			bad++
		}
	}
	if *asJSON {
		if err := writeJSON(c.Env.Stdout, map[string]any{"ok": bad == 0, "receipts": results}); err != nil {
			return err
		}
	} else {
		printVerdicts(c.Env.Stdout, results, len(witnesses))
	}
	if bad > 0 {
		return &ViolationsError{Count: bad}
	}
	return nil
}

const checkProofUsage = `Usage: ledgerctl check-proof FILE --vkey VKEY… [--namespace NS] [--witness-vkey V … [--quorum K]]

Checks portable receipts (from ledgerctl prove or GET /v1/receipts/{seq}/proof;
FILE may hold several, "-" is stdin) with nothing but the log's verifier key:
the receipt's hash recomputed from its fields, the checkpoint's signature and
origin (PREFIX/NS of the --namespace, default "default"), and the receipt's
inclusion in the signed tree. A receipt's result_text is what is hashed,
and its embedded result must be the same JSON value (numbers as exact
decimals), so a file re-encoded by jq or any JSON library still checks; a
receipt without result_text is hashed with its result's exact bytes. A
receipt with a field the format does not have, a field given twice or data
after it is invalid. A receipt of a committed namespace (contract §14) holds
commitments in its payload fields and opens the disclosed ones in
"payloads": each disclosed value must open its commitment, a plain value in a
payload field is invalid, and each field is shown as disclosed or not
disclosed (a holder may drop a "payloads" entry before handing it on). A
field the issuer names in "erased" is shown "erased by S" when the bundle
carries "erased_by" (ledgerctl prove --erased-by): erase receipt S, included
in the same signed tree, of kind erase, after the receipt, whose set the
ranges and salt open, with a range holding the receipt and the field in its
fields (any mismatch makes the receipt invalid); without it, "not disclosed
(issuer says erased by S)". A holder may drop "erased_by". With --witness-vkey,
the checkpoint must also carry valid C2SP cosignatures by at least --quorum of
those witnesses (all of them without --quorum); other signature lines are
ignored. --vkey may be given more than once: a checkpoint signed by any one
of the keys is accepted. A checkpoint signed by a later key is accepted
when the bundle's "keys" (ledgerctl prove adds them) hold the key receipts
that announced it, each proven included in a checkpoint signed by the key
it retired (docs/operations.md).
Exit 0: every receipt is proven; 1: one is not; 2: usage or I/O error.`

const checkProofExamples = `  ledgerctl check-proof receipt-42.json --vkey 'ledger.example.com+1a2b3c4d+AW…'
  ledgerctl check-proof refund.jsonl --vkey ./log.vkey --namespace payments
  ledgerctl check-proof refund.jsonl --vkey ./log.vkey --witness-vkey ./w1.vkey --witness-vkey ./w2.vkey --quorum 1
`

// witnesses reads the --witness-vkey keys and the quorum of them a
// checkpoint's cosignatures must reach (all of them without --quorum).
func (c *CheckProofCommand) witnesses(fs *flag.FlagSet, keys listFlag, quorum int) ([]note.Verifier, int, error) {
	var witnesses []note.Verifier
	for _, wk := range keys {
		wv, err := readVerifier(wk, tlog.NewCosignatureVerifier)
		if err != nil {
			return nil, 0, usageErr(fs, c.Env, "--witness-vkey: %v", err)
		}
		witnesses = append(witnesses, wv)
	}
	need := len(witnesses)
	if flagSet(fs, "quorum") {
		need = quorum
		if need < 1 || need > len(witnesses) {
			return nil, 0, usageErr(fs, c.Env, "--quorum must be between 1 and the number of --witness-vkey (%d)", len(witnesses))
		}
	}
	return witnesses, need, nil
}

// proofVerdict is check-proof's verdict on one portable receipt.
type proofVerdict struct {
	Seq      uint64 `json:"seq"`
	Key      string `json:"idempotency_key"`
	Valid    bool   `json:"valid"`
	Origin   string `json:"origin,omitempty"`
	TreeSize int64  `json:"tree_size,omitempty"`
	// Cosigners is how many --witness-vkey witnesses cosigned.
	Cosigners int `json:"cosigners,omitempty"`
	// KeysLearnt are the ids of the keys the bundle's key receipts
	// announced that were used.
	KeysLearnt []string `json:"keys_learnt,omitempty"`
	// Fields says of each committed payload field (SPEC §14) whether its
	// value is disclosed (and opens its commitment), not disclosed, or
	// erased by an erase receipt the bundle proves.
	Fields map[string]string `json:"fields,omitempty"`
	Error  string            `json:"error,omitempty"`
}

// proofChecker judges portable receipts with the log's key, for one
// namespace, and the witnesses' keys with their quorum.
type proofChecker struct {
	vs        []note.Verifier
	ns        string
	witnesses []note.Verifier
	need      int
}

// check reads one portable receipt in its exact form and verifies it.
func (c proofChecker) check(raw []byte) proofVerdict {
	p, err := tlog.ParsePortable(raw)
	if err != nil {
		// Name the receipt when the document says which it is (a
		// result that is not its result_text, SPEC §9.1).
		var named struct {
			Receipt struct {
				Seq uint64 `json:"seq"`
				Key string `json:"idempotency_key"`
			} `json:"receipt"`
		}
		_ = json.Unmarshal(raw, &named)
		return proofVerdict{Seq: named.Receipt.Seq, Key: named.Receipt.Key, Error: err.Error()}
	}
	cp, learnt, err := tlog.CheckPortableKeys(p, c.vs, c.ns)
	var fields map[string]string
	if err == nil {
		fields, err = tlog.CheckDisclosures(p, cp)
	}
	cosigners := 0
	if err == nil && len(c.witnesses) > 0 {
		cosigners = tlog.CountCosigners([]byte(p.Checkpoint), c.witnesses)
		if cosigners < c.need {
			err = fmt.Errorf("%w: %d of the %d witnesses cosigned the checkpoint, %d needed", tlog.ErrCosignature, cosigners, len(c.witnesses), c.need)
		}
	}
	r := proofVerdict{Cosigners: cosigners, Seq: p.Receipt.Seq, Key: p.Receipt.IdempotencyKey, Valid: err == nil, Origin: cp.Origin,
		TreeSize: cp.Size, KeysLearnt: learnt, Fields: fields}
	if err != nil {
		r.Error = err.Error()
	}
	return r
}

// printVerdicts prints one line per verdict.
func printVerdicts(w io.Writer, results []proofVerdict, witnesses int) {
	for _, r := range results {
		if !r.Valid {
			fmt.Fprintf(w, "INVALID: receipt %d (key %s): %s\n", r.Seq, keyCell(r.Key), r.Error)
			continue
		}
		fmt.Fprintf(w, "valid: receipt %d (key %s) is in %s at tree size %d", r.Seq, keyCell(r.Key), r.Origin, r.TreeSize)
		if witnesses > 0 {
			fmt.Fprintf(w, ", cosigned by %d of %d witnesses", r.Cosigners, witnesses)
		}
		if len(r.KeysLearnt) > 0 {
			fmt.Fprintf(w, ", signed by key %s announced on the chain", strings.Join(r.KeysLearnt, ", "))
		}
		for _, f := range chain.PayloadFields {
			if v, ok := r.Fields[f.Name()]; ok {
				fmt.Fprintf(w, "; %s %s", f.Name(), v)
			}
		}
		fmt.Fprintln(w)
	}
}
