package gen

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/effect-ledger/effect-ledger/storage/sqlite"
)

// Cached returns a generated ledger of n receipts with its key index in
// the temp directory, generating both once (logf, if set, says so): the
// benchmarks and scripts/bench share it.
func Cached(ctx context.Context, n int, logf func(format string, args ...any)) (string, error) {
	cached := filepath.Join(os.TempDir(), fmt.Sprintf("effect-ledger-bench-%d-schema%d-inline.db", n, sqlite.SchemaVersion))
	if _, err := os.Stat(sqlite.IndexPath(cached)); err == nil {
		return cached, nil
	}
	if logf != nil {
		logf("generating a %d-receipt ledger at %s (once)", n, cached)
	}
	tmp := cached + ".tmp"
	for _, p := range []string{tmp, tmp + ".lock", sqlite.IndexPath(tmp), sqlite.IndexPath(tmp) + ".lock", cached, sqlite.IndexPath(cached)} {
		_ = os.RemoveAll(p)
	}
	if _, err := Ledger(ctx, tmp, n, nil); err != nil {
		return "", err
	}
	if err := os.Rename(sqlite.IndexPath(tmp), sqlite.IndexPath(cached)); err != nil {
		return "", err
	}
	_ = os.Remove(tmp + ".lock")
	_ = os.Remove(sqlite.IndexPath(tmp) + ".lock")
	return cached, os.Rename(tmp, cached)
}

// Copy copies the ledger file src and its key index (if any) to dst,
// which must not exist.
func Copy(src, dst string) error {
	if err := copyFile(src, dst); err != nil {
		return err
	}
	entries, err := os.ReadDir(sqlite.IndexPath(src))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := os.Mkdir(sqlite.IndexPath(dst), 0o755); err != nil {
		return err
	}
	for _, e := range entries {
		if e.Type().IsRegular() && e.Name() != "LOCK" {
			if err := copyFile(filepath.Join(sqlite.IndexPath(src), e.Name()), filepath.Join(sqlite.IndexPath(dst), e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}
