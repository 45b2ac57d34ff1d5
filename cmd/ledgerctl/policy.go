package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// PolicyCommand runs `ledgerctl policy set|show` (SPEC §13) against a
// server.
type PolicyCommand struct{ *Env }

const policyUsage = `Usage:
  ledgerctl policy set  --server URL NS FILE [--json]
  ledgerctl policy show --server URL NS [--json]

A namespace's policy is the gate in front of its effects: rules matched by
the tool's name (a glob) that send calls to a person for approval, deny them,
or refuse a retry of a failed call that changes nothing (docs/approvals.md).
Setting it needs an admin token and appends a policy receipt, unless the
policy is the one in force; reading it, a reader token. An empty policy ({})
gates nothing. "ledgerctl policy <set|show> --help" shows each one's flags.
`

// Run dispatches the policy subcommands.
func (c *PolicyCommand) Run(ctx context.Context, args []string) error {
	return dispatch(ctx, c.Env, "policy", policyUsage, args, []subcommand{{"set", c.set}, {"show", c.show}})
}

// serverOnly registers --server, --token and --json.
func serverOnly(fs *flag.FlagSet) *sourceFlags {
	var src sourceFlags
	src.registerServer(fs)
	src.registerJSON(fs)
	return &src
}

func (c *PolicyCommand) set(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("policy set", flag.ContinueOnError)
	src := serverOnly(fs)
	pos, err := parse(fs, c.Env, args, `Usage: ledgerctl policy set --server URL NS FILE [--json]

Sets the policy of namespace NS to the JSON object in FILE ("-": standard
input) and prints the policy receipt appended; a policy equal to the one in
force appends nothing. Needs an admin token. A rule the server refuses is
named by its member (details.field).`,
		`  ledgerctl policy set --server http://127.0.0.1:8080 payments policy.json
  echo '{}' | ledgerctl policy set --server http://127.0.0.1:8080 payments -
`)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return usageErr(fs, c.Env, "want NS and FILE")
	}
	ns, file := pos[0], pos[1]
	if !ledger.ValidNamespace(ns) {
		return usageErr(fs, c.Env, "namespace %q: names are 1–64 bytes of a-z 0-9 . _ -", ns)
	}
	if err := src.check(); err != nil {
		return usageErr(fs, c.Env, "%v", err)
	}
	policy, err := readPolicy(file)
	if err != nil {
		return err
	}
	src.namespace = ns
	client, err := src.client(fs, c.Env)
	if err != nil {
		return err
	}
	res, err := client.setPolicy(ctx, policy)
	if err != nil {
		return approvalsErr(err)
	}
	if src.json {
		return writeJSON(c.Stdout, res)
	}
	if res.Changed != nil && !*res.Changed {
		_, err = fmt.Fprintf(c.Stdout, "policy of %s unchanged: it is the policy in force (receipt %d)\n", ns, res.Seq)
		return err
	}
	where := strconv.FormatUint(res.Seq, 10)
	if res.Receipt != nil {
		where = fmt.Sprintf("%d:%s", res.Receipt.Seq, res.Receipt.Hash)
	}
	_, err = fmt.Fprintf(c.Stdout, "policy of %s set (receipt %s)\n", ns, where)
	return err
}

// readPolicy reads a policy file ("-": standard input), which must hold
// one JSON object.
func readPolicy(file string) (json.RawMessage, error) {
	var data []byte
	var err error
	if file == "-" {
		data, err = io.ReadAll(io.LimitReader(os.Stdin, 1<<20))
	} else {
		data, err = os.ReadFile(file)
	}
	if err != nil {
		return nil, fmt.Errorf("read policy: %w", err)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(data, &obj); err != nil || obj == nil {
		return nil, fmt.Errorf("policy %s is not a JSON object: %w", file, errOrNull(err))
	}
	return json.RawMessage(bytes.TrimSpace(data)), nil
}

func errOrNull(err error) error {
	if err == nil {
		return errors.New("null")
	}
	return err
}

func (c *PolicyCommand) show(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("policy show", flag.ContinueOnError)
	src := serverOnly(fs)
	pos, err := parse(fs, c.Env, args, `Usage: ledgerctl policy show --server URL NS [--json]

Prints the policy in force in namespace NS, indented, with the receipt that
set it.`,
		`  ledgerctl policy show --server http://127.0.0.1:8080 payments
`)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErr(fs, c.Env, "want exactly one NS")
	}
	if !ledger.ValidNamespace(pos[0]) {
		return usageErr(fs, c.Env, "namespace %q: names are 1–64 bytes of a-z 0-9 . _ -", pos[0])
	}
	if err := src.check(); err != nil {
		return usageErr(fs, c.Env, "%v", err)
	}
	src.namespace = pos[0]
	client, err := src.client(fs, c.Env)
	if err != nil {
		return err
	}
	res, err := client.policy(ctx)
	if err != nil {
		return approvalsErr(err)
	}
	if src.json {
		return writeJSON(c.Stdout, res)
	}
	if res.Seq == 0 {
		fmt.Fprintf(c.Stdout, "namespace %s: no policy (the gate lets every call through)\n", pos[0])
	} else {
		fmt.Fprintf(c.Stdout, "namespace %s: policy of receipt %d\n", pos[0], res.Seq)
	}
	return writeIndented(c.Stdout, res.Policy)
}

// writeIndented prints JSON text indented, as it is when it is not JSON.
func writeIndented(w io.Writer, data json.RawMessage) error {
	var buf bytes.Buffer
	if err := json.Indent(&buf, data, "", "  "); err != nil {
		buf.Reset()
		buf.Write(data)
	}
	buf.WriteByte('\n')
	_, err := w.Write(buf.Bytes())
	return err
}

// approvalsErr explains a 404 not_found (the server has no such route)
// and names the member a 400 invalid_request refused.
func approvalsErr(err error) error {
	var le *ledger.Error
	if !errors.As(err, &le) {
		return err
	}
	switch f, _ := le.Details["field"].(string); {
	case le.Code == ledger.ECodeNotFound:
		return fmt.Errorf("%w (the server serves no approvals: a ledgerd before v1.3?)", err)
	case le.Code == ledger.ECodeInvalidRequest && f != "":
		return fmt.Errorf("%s: %w", f, err)
	}
	return err
}
