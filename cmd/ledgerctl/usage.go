package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// parse parses args with fs, printing usage text with examples on error.
// Flags may come before or after positional arguments, which it returns.
func parse(fs *flag.FlagSet, env *Env, args []string, summary, examples string) ([]string, error) {
	setUsage(fs, env, summary, examples)
	return parseArgs(fs, args)
}

// parseNoArgs is parse for a command that takes no positional arguments.
func parseNoArgs(fs *flag.FlagSet, env *Env, args []string, summary, examples string) error {
	pos, err := parse(fs, env, args, summary, examples)
	if err == nil && len(pos) > 0 {
		err = usageErr(fs, env, "unexpected arguments %q", pos)
	}
	return err
}

// setUsage makes fs print its usage text, flags and examples on env.Stderr.
func setUsage(fs *flag.FlagSet, env *Env, summary, examples string) {
	fs.SetOutput(env.Stderr)
	fs.Usage = func() {
		fmt.Fprintf(env.Stderr, "%s\n\nFlags:\n", summary)
		printFlags(env.Stderr, fs)
		fmt.Fprintf(env.Stderr, "\nExamples:\n%s", examples)
	}
}

// shortForms are the one-letter forms of flags, listed on the flag's
// line: -n is --namespace.
var shortForms = map[string]string{"namespace": "n"}

// printFlags lists fs's flags as flag.PrintDefaults does, but spelled
// with two dashes, the way the messages and the documentation name them
// (a short form with one, on its flag's line).
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		for long, short := range shortForms {
			if f.Name == short && fs.Lookup(long) != nil {
				return // listed with its long form
			}
		}
		name, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if len(f.Name) == 1 {
			line = "  -" + f.Name
		}
		if name != "" {
			line += " " + name
		}
		if short, ok := shortForms[f.Name]; ok && fs.Lookup(short) != nil {
			line += ", -" + short // the same flag
			if name != "" {
				line += " " + name
			}
		}
		line += "\n    \t" + strings.ReplaceAll(usage, "\n", "\n    \t")
		switch f.DefValue {
		case "", "false", "0":
		default:
			line += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintln(w, line)
	})
}

// parseArgs parses args with fs; flags may come before or after the
// positional arguments, which it returns.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, errUsage
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// usageErr prints msg and the command's usage and returns errUsage.
func usageErr(fs *flag.FlagSet, env *Env, format string, args ...any) error {
	fmt.Fprintf(env.Stderr, "ledgerctl %s: %s\n\n", fs.Name(), fmt.Sprintf(format, args...))
	fs.Usage()
	return errUsage
}
