package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/verify"
)

// ErasuresCommand runs `ledgerctl erasures export` (SPEC §14): the
// erasures file that `ledgerctl erase --replay` applies to a ledger
// restored from a backup taken before them.
type ErasuresCommand struct{ *Env }

const erasuresUsage = `Usage:
  ledgerctl erasures export (--db FILE|URL | --server URL) [--namespace NS] [--out FILE]

Lists what the ledger erased (docs/privacy.md, "Backups"): per namespace
(every namespace unless --namespace is given), each erase receipt with each
receipt it erased by seq, chain hash and fields and the MACs of the subjects
it was asked for, and the keys marked pending, as one JSON document of format
effect-ledger/erasures/v1. It holds no value, but it says which receipts were
erased together: keep it as you keep the ledger. ledgerctl erase --replay FILE applies it to a ledger
restored from a backup taken before those erasures. With --server it needs an
admin token when tokens exist.`

// Run dispatches the erasures subcommand.
func (c *ErasuresCommand) Run(ctx context.Context, args []string) error {
	return dispatch(ctx, c.Env, "erasures", erasuresUsage, args, []subcommand{{"export", c.export}})
}

func (c *ErasuresCommand) export(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("erasures export", flag.ContinueOnError)
	var src sourceFlags
	src.registerSource(fs)
	declareNamespace(fs, &src.namespace, "", "only this `namespace` (default every namespace)")
	out := fs.String("out", "", "write the document to `FILE` (mode 0600) instead of standard output")
	if err := parseNoArgs(fs, c.Env, args, erasuresUsage,
		"  ledgerctl erasures export --db ledger.db --out erasures-2026-12-07.json\n"+
			"  ledgerctl erasures export --server http://127.0.0.1:8080 --namespace customers > erasures.json\n"); err != nil {
		return err
	}
	if err := src.check(); err != nil {
		return usageErr(fs, c.Env, "%v", err)
	}
	var parts []ledger.NamespaceErasures
	var err error
	if src.db != "" {
		parts, err = exportDB(ctx, c.Env, src.db, src.namespace)
	} else {
		parts, err = exportServer(ctx, fs, c.Env, &src)
	}
	if err != nil {
		return err
	}
	doc := ledger.ErasureFile{Format: ledger.ErasureFileFormat, ExportedAt: uint64(time.Now().UnixMilli()), Namespaces: parts}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return fmt.Errorf("encode erasures: %w", err)
	}
	if _, err := ledger.ParseErasureFile(bytes.NewReader(b.Bytes())); err != nil {
		return fmt.Errorf("the ledger's erasures do not make a valid file (ledgerctl verify shows what is wrong): %w", err)
	}
	if *out == "" {
		_, err = c.Stdout.Write(b.Bytes())
		return err
	}
	return writeFileAtomic(*out, b.Bytes())
}

// exportDB reads the erasures of namespace ns (every namespace when ns is
// empty) from the database dsn, opened read-only.
func exportDB(ctx context.Context, env *Env, dsn, ns string) ([]ledger.NamespaceErasures, error) {
	st, err := openDB(ctx, dsn, env, true)
	if err != nil {
		return nil, err
	}
	defer func() { _ = st.Close() }()
	names := []string{ns}
	if ns == "" {
		if names, err = st.Namespaces(ctx); err != nil {
			return nil, fmt.Errorf("list namespaces: %w", err)
		}
	}
	out := make([]ledger.NamespaceErasures, 0, len(names))
	for _, name := range names {
		c, err := chainOf(ctx, st, dsn, name)
		if err != nil {
			return nil, err
		}
		part, err := ledger.ExportErasures(ctx, c, name)
		if err != nil {
			return nil, err
		}
		out = append(out, *part)
	}
	return out, nil
}

// exportServer reads the erasures of --namespace (every namespace when it
// is empty) from --server.
func exportServer(ctx context.Context, fs *flag.FlagSet, env *Env, src *sourceFlags) ([]ledger.NamespaceErasures, error) {
	srv, err := src.client(fs, env)
	if err != nil {
		return nil, err
	}
	names := []string{src.namespace}
	if src.namespace == "" {
		infos, err := srv.Client.Namespaces(ctx)
		if err != nil {
			return nil, verify.ServerErr(err)
		}
		names = names[:0]
		for _, n := range infos {
			names = append(names, n.Name)
		}
	}
	out := make([]ledger.NamespaceErasures, 0, len(names))
	for _, name := range names {
		in, err := srv.in(name)
		if err != nil {
			return nil, err
		}
		got, err := in.Client.Erasures(ctx)
		if err != nil {
			return nil, verify.ServerErr(err)
		}
		raw, err := json.Marshal(got)
		if err != nil {
			return nil, fmt.Errorf("erasures of %s: %w", name, err)
		}
		var part ledger.NamespaceErasures
		if err := json.Unmarshal(raw, &part); err != nil {
			return nil, fmt.Errorf("erasures of %s: %w", name, err)
		}
		if part.Namespace != name {
			return nil, fmt.Errorf("erasures of %s: the server answered for namespace %q", name, part.Namespace)
		}
		out = append(out, part)
	}
	return out, nil
}

// writeFileAtomic writes data to path with mode 0600 through a temporary
// file beside it, so that path is never left half written.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
