package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/effect-ledger/effect-ledger/internal/version"
)

// VersionCommand runs `ledgerctl version` (also `ledgerctl --version`).
type VersionCommand struct{ *Env }

// Run prints the build version and the contract versions implemented.
func (c *VersionCommand) Run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	asJSON := jsonFlag(fs, "print JSON")
	if err := parseNoArgs(fs, c.Env, args, "Usage: ledgerctl version [--json]\n\nPrints the build version (from the module's build info: the release, or the\nrevision it was built from) and the contract versions ledgerctl implements.",
		"  ledgerctl version\n  ledgerctl --version\n  ledgerctl version --json\n"); err != nil {
		return err
	}
	info := version.Read("ledgerctl")
	if *asJSON {
		_, err := c.Stdout.Write(info.JSON())
		return err
	}
	_, err := fmt.Fprint(c.Stdout, info.String())
	return err
}
