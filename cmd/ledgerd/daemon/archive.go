package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// checkArchiveDir checks, at start, that --archive-dir is a directory
// ledgerd can write durably: a probe file is written, fsynced and
// removed, and the directory fsynced. A prune writes its segments there
// and deletes the bodies only once they are read back (SPEC §16).
func checkArchiveDir(dir string) error {
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("--archive-dir %s does not exist: create it (ledgerd never creates it: it is where the only copy of pruned receipts goes)", dir)
	case err != nil:
		return fmt.Errorf("--archive-dir: %w", err)
	case !fi.IsDir():
		return fmt.Errorf("--archive-dir %s is not a directory", dir)
	}
	probe, err := os.CreateTemp(dir, ".ledgerd-probe-*")
	if err != nil {
		return fmt.Errorf("--archive-dir %s is not writable: %w", dir, err)
	}
	name := probe.Name()
	_, err = probe.WriteString("effect-ledger archive probe\n")
	if err == nil {
		err = probe.Sync()
	}
	if cerr := probe.Close(); err == nil {
		err = cerr
	}
	if rerr := os.Remove(name); err == nil {
		err = rerr
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("--archive-dir %s: writing and fsyncing a probe file (%s) failed: %w", dir, filepath.Base(name), err)
	}
	return nil
}

// syncDir fsyncs a directory, so that the entries created or removed in
// it are durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
