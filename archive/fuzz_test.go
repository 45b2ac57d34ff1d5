package archive_test

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/mod/sumdb/note"

	"github.com/effect-ledger/effect-ledger/archive"
)

// FuzzCheck feeds Check segment files it did not write: it must return a
// fault, never panic or accept a segment whose receipts it cannot prove.
func FuzzCheck(f *testing.F) {
	l := newTestLog(f, 8)
	seg := l.write(f, f.TempDir(), 3, 6)
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(seg, name))
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	f.Add(read(archive.ManifestFile), read(archive.ReceiptsFile), read(archive.PayloadsFile))
	f.Fuzz(func(t *testing.T, manifest, receipts, payloads []byte) {
		dir := t.TempDir()
		for name, b := range map[string][]byte{archive.ManifestFile: manifest, archive.ReceiptsFile: receipts, archive.PayloadsFile: payloads} {
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		got, err := archive.Check(dir, []note.Verifier{l.v})
		if err == nil && len(got.Hashes) != int(got.Through-got.From+1) {
			t.Fatalf("accepted %d hashes for %d..%d", len(got.Hashes), got.From, got.Through)
		}
	})
}
