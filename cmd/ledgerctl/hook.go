package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/cmd/ledgerctl/hook"
)

// HookCommand runs `ledgerctl hook`, the PreToolUse/PostToolUse command
// of a coding agent, and `ledgerctl hook install`, which writes it into
// the agent's settings.
type HookCommand struct {
	*Env
	Stdin io.Reader
}

// hookFlags are what a hook run needs, which install writes into the
// command it installs.
type hookFlags struct {
	agent, server, token, namespace, policy, scope string
	failOpen                                       bool
	lease, timeout                                 time.Duration
}

func (f *hookFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.agent, "agent", "claude-code", "the coding `agent`: claude-code, codex, or another with the same hook protocol (ledger tools are AGENT.TOOL)")
	fs.StringVar(&f.server, "server", "", "ledgerd base `URL` (env LEDGER_SERVER)")
	fs.StringVar(&f.token, "token", "", "bearer `token` (env LEDGERCTL_TOKEN, else LEDGER_TOKEN); install never writes it")
	declareNamespace(fs, &f.namespace, "default", "the `namespace` effects are recorded in")
	fs.StringVar(&f.policy, "policy", "", "JSON `file` of rules saying which calls are effects, which read, which dedupe (docs/hooks.md)")
	fs.StringVar(&f.scope, "scope", "", "what dedupe keys are derived within (default: the agent's session)")
	fs.BoolVar(&f.failOpen, "fail-open", false, "UNSAFE: let calls run unrecorded when the ledger cannot be reached")
	fs.DurationVar(&f.lease, "lease", 15*time.Minute, "how long a reservation holds its key while the tool runs")
	fs.DurationVar(&f.timeout, "timeout", 10*time.Second, "how long a hook waits for the ledger")
}

const hookUsage = `Usage: ledgerctl hook [--agent NAME] [--server URL] [-n NS] [--policy FILE] [--scope S] [--fail-open]
       ledgerctl hook install [--agent NAME] [--project DIR | --user] [flags of the hook]

The PreToolUse and PostToolUse command of a coding agent (Claude Code,
Codex CLI): it reads the agent's hook object on standard input. Before a
tool runs it reserves the call's effect in the ledger and prints the
agent's deny, with a reason, when the call must not run (already ran,
awaits a person's approval, denied by the namespace's policy, the ledger
unreachable); after, it commits what the tool reported. Reads are not
recorded. "install" writes the command into the agent's settings. See
docs/hooks.md.`

const hookExamples = `  ledgerctl hook install --agent claude-code --server http://127.0.0.1:8080
  ledgerctl hook install --agent codex --user --server http://127.0.0.1:8080 --policy ~/.config/effect-ledger/hooks.json
  echo '{"hook_event_name":"PreToolUse",…}' | ledgerctl hook --server http://127.0.0.1:8080
`

// Run runs one hook call, or install.
func (c *HookCommand) Run(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] == "install" {
		return c.install(args[1:])
	}
	fs := flag.NewFlagSet("hook", flag.ContinueOnError)
	var f hookFlags
	f.register(fs)
	if err := parseNoArgs(fs, c.Env, args, hookUsage, hookExamples); err != nil {
		return err
	}
	in, err := hook.ReadInput(c.Stdin)
	if err != nil {
		// Exit 2 blocks the call in both agents, with this on stderr.
		fmt.Fprintln(c.Stderr, "effect-ledger:", err, "- the call was not run")
		return errUsage
	}
	logger := slog.New(slog.NewTextHandler(c.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	h, err := f.hook(logger)
	switch in.Event {
	case hook.PreToolUse:
		ans := hook.Deny("effect-ledger: the hook is not configured (" + fmt.Sprint(err) + "), so the call was not run.")
		if err == nil {
			ctx, cancel := context.WithTimeout(ctx, f.timeout)
			defer cancel()
			ans = h.Pre(ctx, in)
		}
		if ans == nil {
			return nil
		}
		return json.NewEncoder(c.Stdout).Encode(ans)
	case hook.PostToolUse, hook.PostToolUseFailure:
		if err == nil {
			ctx, cancel := context.WithTimeout(ctx, f.timeout)
			defer cancel()
			err = h.Post(ctx, in)
		}
		if err != nil {
			fmt.Fprintln(c.Stderr, "effect-ledger: the outcome was not recorded:", err)
			return exitCode(1)
		}
	}
	return nil // other events: nothing to do
}

// hook builds the hook the flags describe.
func (f *hookFlags) hook(logger *slog.Logger) (*hook.Hook, error) {
	server := f.server
	for _, v := range []string{os.Getenv("LEDGER_SERVER"), os.Getenv("LEDGERCTL_SERVER")} {
		if server == "" {
			server = v
		}
	}
	if server == "" {
		return nil, errors.New("no ledger: give --server URL or set LEDGER_SERVER")
	}
	base, err := serverURL(server)
	if err != nil {
		return nil, fmt.Errorf("--server: %w", err)
	}
	c, err := client.New(base, client.WithToken(serverToken(f.token)), client.WithNamespace(f.namespace),
		client.WithRetry(2, 100*time.Millisecond, time.Second), client.WithLogger(logger))
	if err != nil {
		return nil, err
	}
	var rules hook.Rules
	if f.policy != "" {
		if rules, err = hook.LoadRules(f.policy); err != nil {
			return nil, err
		}
	}
	dir, err := hook.DefaultStateDir()
	if err != nil {
		return nil, err
	}
	return &hook.Hook{Client: c, Agent: f.agent, Rules: rules, Scope: f.scope, FailOpen: f.failOpen, Lease: f.lease,
		Logger: logger, State: &hook.State{Dir: dir, Scope: base + "\x00" + c.Namespace()}}, nil
}

// install writes the hook command into the agent's settings.
func (c *HookCommand) install(args []string) error {
	fs := flag.NewFlagSet("hook install", flag.ContinueOnError)
	var f hookFlags
	f.register(fs)
	project := fs.String("project", "", "the project `directory` whose settings get the hook (default: the current directory)")
	user := fs.Bool("user", false, "write the user's own settings instead of a project's")
	command := fs.String("command", "", "the `path` of ledgerctl the agent runs (default: this ledgerctl)")
	if err := parseNoArgs(fs, c.Env, args, `Usage: ledgerctl hook install [--agent NAME] [--project DIR | --user] [flags of the hook]

Writes "ledgerctl hook" with the given flags into the agent's settings as
its PreToolUse and PostToolUse command for every tool (Claude Code:
.claude/settings.json, also PostToolUseFailure; Codex: .codex/hooks.json),
merged with what is there: every other setting stays as it was, and a
hook this command installed before is replaced. A settings file that is
not a JSON object is refused and left as it is. The token is never
written: the agent's environment gives it (LEDGER_TOKEN).`, hookExamples); err != nil {
		return err
	}
	if *user && *project != "" {
		return usageErr(fs, c.Env, "give --project DIR or --user, not both")
	}
	dir := *project
	if dir == "" {
		dir = "."
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	home, err := os.UserHomeDir()
	if err != nil && *user {
		return err
	}
	s, err := hook.SettingsFor(f.agent, dir, home, *user)
	if err != nil {
		return usageErr(fs, c.Env, "%v", err)
	}
	exe := *command
	if exe == "" {
		if exe, err = os.Executable(); err != nil {
			return fmt.Errorf("find ledgerctl: %w", err)
		}
	}
	text, err := hook.Install(s, f.commandLine(fs, exe))
	if err != nil {
		return err
	}
	fmt.Fprintf(c.Stdout, "wrote %s:\n%s", s.Path, text)
	return nil
}

// commandLine is the hook command with the flags given to install (the
// token excepted), each quoted for the shell the agent runs it with.
func (f *hookFlags) commandLine(fs *flag.FlagSet, exe string) string {
	parts := []string{shellQuote(exe), "hook", "--agent", shellQuote(f.agent)}
	fs.Visit(func(fl *flag.Flag) {
		switch fl.Name {
		case "agent", "token", "project", "user", "command":
		case "fail-open":
			parts = append(parts, "--fail-open")
		case "n":
			parts = append(parts, "--namespace", shellQuote(fl.Value.String()))
		default:
			parts = append(parts, "--"+fl.Name, shellQuote(fl.Value.String()))
		}
	})
	return strings.Join(parts, " ")
}

// shellQuote quotes s for a POSIX shell unless it needs none.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=@%+,") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// exitCode is an error that ends ledgerctl with that code, its message
// already printed.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit %d", int(e)) }
