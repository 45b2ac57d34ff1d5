package test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// An archived segment (SPEC §16), through the real binaries: ledgerctl
// archive writes it from the database while ledgerd runs, ledgerctl
// verify --segment checks it alone, and a change to any of its files is
// segment_invalid.
func TestLedgerctl_archiveSegment(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, func(t *testing.T, db string) {
		dir := t.TempDir()
		key := newRotationKey(t, dir, "log.key", "ex.test")
		l := StartLedgerd(t, db, "--signing-key", key.file, "--log-origin", "ex.test", "--checkpoint-interval", "20ms")
		marker := "marker-" + strings.ReplaceAll(time.Now().Format("150405.000000"), ".", "")
		for i := range 10 {
			k := "seg-key-" + string(rune('a'+i))
			tok := l.Reserve(t, `{"idempotency_key":"`+k+`","execution_id":"e","tool":"mail.send","effect":"write"}`)
			l.Commit(t, k, `{"reservation":"`+tok+`","outcome":"succeeded","result":{"to":"`+marker+`"}}`)
		}
		waitCheckpoint(t, l, key.vkey, 20)
		archiveDir := filepath.Join(dir, "archive")
		require.NoError(t, os.Mkdir(archiveDir, 0o755))

		_, stderr, code := ledgerctl(t, "archive", "--db", db, "--through", "21", "--dir", archiveDir)
		require.Equal(t, 2, code, "beyond the chain")
		require.Contains(t, stderr, "1…20")

		var segs []string
		for _, r := range [][]string{{"1", "12"}, {"13", "20"}} {
			out, stderr, code := ledgerctl(t, "archive", "--db", db, "--from", r[0], "--through", r[1], "--dir", archiveDir, "--vkey", key.vkeyFile, "--json")
			require.Equal(t, 0, code, stderr)
			var rep struct {
				OK      bool
				Path    string
				Signers []string
			}
			require.NoError(t, json.Unmarshal([]byte(out), &rep))
			require.True(t, rep.OK)
			require.Equal(t, filepath.Join(archiveDir, "default-"+r[0]+"-"+r[1]), rep.Path)
			require.Equal(t, []string{key.id}, rep.Signers)
			segs = append(segs, rep.Path)
		}
		// Committed payloads travel in payloads.jsonl, never in the receipts.
		receipts, err := os.ReadFile(filepath.Join(segs[0], "receipts.jsonl"))
		require.NoError(t, err)
		require.NotContains(t, string(receipts), marker)
		payloads, err := os.ReadFile(filepath.Join(segs[0], "payloads.jsonl"))
		require.NoError(t, err)
		require.Contains(t, string(payloads), marker)

		for _, seg := range segs {
			out, stderr, code := ledgerctl(t, "verify", "--segment", seg, "--vkey", key.vkeyFile)
			require.Equal(t, 0, code, stderr)
			require.Contains(t, out, "OK: segment")
			require.Contains(t, out, "signed by key ids "+key.id)
		}
		other := newRotationKey(t, dir, "other.key", "ex.test")
		out, _, code := ledgerctl(t, "verify", "--segment", segs[1], "--vkey", other.vkeyFile)
		require.Equal(t, 1, code, out)
		require.Contains(t, out, "segment_invalid")

		// Any changed file fails the check.
		for _, name := range []string{"receipts.jsonl", "payloads.jsonl", "manifest.json"} {
			path := filepath.Join(segs[1], name)
			orig, err := os.ReadFile(path)
			require.NoError(t, err)
			changed := []byte(strings.Replace(string(orig), "e", "f", 1))
			if name == "payloads.jsonl" {
				changed = []byte(strings.Replace(string(orig), marker, marker+"x", 1))
			}
			require.NoError(t, os.WriteFile(path, changed, 0o644))
			out, _, code := ledgerctl(t, "verify", "--segment", segs[1], "--vkey", key.vkeyFile, "--json")
			require.Equal(t, 1, code, "%s changed: %s", name, out)
			require.Contains(t, out, `"rule":"segment_invalid"`)
			require.NoError(t, os.WriteFile(path, orig, 0o644))
		}
		_, stderr, code = ledgerctl(t, "verify", "--segment", filepath.Join(archiveDir, "absent"))
		require.Equal(t, 2, code, stderr)
		_, _, code = ledgerctl(t, "verify", "--segment", segs[0], "--db", db)
		require.Equal(t, 2, code, "--segment goes alone")
	})
}
