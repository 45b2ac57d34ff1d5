package test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/testkit/pgtest"
)

// TestVerifiableLog_postgresTamper: on PostgreSQL too, a published
// checkpoint catches a receipt edited in place and a suffix cut off (with
// the head row moved back to match), which the chain alone cannot show.
func TestVerifiableLog_postgresTamper(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	keyFile, vkey := keygen(t, dir, "pg.test")
	for _, tt := range []struct {
		desc      string
		tamper    []string
		cleanSelf bool
		wantRule  string
	}{
		{"edit in place", []string{
			`ALTER TABLE receipts DISABLE TRIGGER USER`,
			`UPDATE receipts SET external_ref = 'forged' WHERE namespace = 'default' AND seq = 4`,
		}, false, "hash_mismatch"},
		{"cut a suffix, head moved back", []string{
			`ALTER TABLE receipts DISABLE TRIGGER USER`,
			`ALTER TABLE head DISABLE TRIGGER USER`,
			`ALTER TABLE tree_hashes DISABLE TRIGGER USER`,
			`ALTER TABLE keys DISABLE TRIGGER USER`,
			`DELETE FROM receipts WHERE namespace = 'default' AND seq > 21`,
			`DELETE FROM keys WHERE namespace = 'default' AND greatest(reserve_seq, final_seq) > 21`,
			`UPDATE head SET seq = 21, hash = (SELECT hash FROM receipts WHERE namespace = 'default' AND seq = 21) WHERE namespace = 'default'`,
		}, true, "checkpoint_mismatch"},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			url := pgtest.URL(t)
			l := StartLedgerd(t, url, "--signing-key", keyFile, "--log-origin", "pg.test", "--checkpoint-interval", "100ms")
			appendN(t, l, "pg", 26)
			note, _ := waitCheckpoint(t, l, vkey, 26)
			require.NoError(t, l.Stop())
			cp := filepath.Join(t.TempDir(), "checkpoint.txt")
			require.NoError(t, os.WriteFile(cp, []byte(note), 0o644))
			_, stderr, code := ledgerctl(t, "verify", "--db", url, "--checkpoint", cp, "--vkey", vkey)
			require.Equal(t, 0, code, stderr)

			conn, err := pgx.Connect(context.Background(), url)
			require.NoError(t, err)
			for _, q := range tt.tamper {
				_, err := conn.Exec(context.Background(), q)
				require.NoError(t, err, q)
			}
			require.NoError(t, conn.Close(context.Background()))

			requireCaughtByCheckpoint(t, url, cp, vkey, tt.cleanSelf, tt.wantRule)
		})
	}
}
