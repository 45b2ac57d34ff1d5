package tlog_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/effect-ledger/effect-ledger/tlog"
)

func TestCheckpoint_Text(t *testing.T) {
	c := tlog.Checkpoint{Origin: "ledger.example.com/default", Size: 2, Root: tlog.EmptyRoot}
	// printf '' | sha256sum | xxd -r -p | base64
	assert.Equal(t, "ledger.example.com/default\n2\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\n", c.Text())
	got, err := tlog.ParseCheckpoint(c.Text())
	require.NoError(t, err)
	assert.Equal(t, c, got)
	got, err = tlog.ParseCheckpoint(c.Text() + "extension line\n")
	require.NoError(t, err, "extension lines are allowed")
	assert.Equal(t, c, got)
}

func TestParseCheckpoint_Err(t *testing.T) {
	for _, tt := range []struct{ desc, text string }{
		{"no final newline", "o/default\n2\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="},
		{"two lines", "o/default\n2\n"},
		{"empty origin", "\n2\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\n"},
		{"leading zero", "o/default\n02\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\n"},
		{"negative", "o/default\n-2\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\n"},
		{"short root", "o/default\n2\nAAAA\n"},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			_, err := tlog.ParseCheckpoint(tt.text)
			assert.ErrorIs(t, err, tlog.ErrBadCheckpoint)
		})
	}
}

func TestOpenCheckpoint(t *testing.T) {
	skey, vkey, err := tlog.GenerateKey("ledger.example.com")
	require.NoError(t, err)
	s, vkey2, _, err := tlog.LoadSignerText(skey, "ledger.example.com")
	require.NoError(t, err)
	assert.Equal(t, vkey, vkey2, "the verifier key derived from the private key")
	v, err := tlog.NewVerifier(vkey)
	require.NoError(t, err)
	c := tlog.Checkpoint{Origin: tlog.Origin("ledger.example.com", "default"), Size: 7, Root: tlog.EmptyRoot}
	msg, err := tlog.Sign(c, s)
	require.NoError(t, err)
	got, err := tlog.OpenCheckpoint(msg, v, "default")
	require.NoError(t, err)
	assert.Equal(t, c, got)

	t.Run("ErrWrongKey", func(t *testing.T) {
		_, other, err := tlog.GenerateKey("ledger.example.com")
		require.NoError(t, err)
		ov, err := tlog.NewVerifier(other)
		require.NoError(t, err)
		_, err = tlog.OpenCheckpoint(msg, ov, "default")
		assert.ErrorIs(t, err, tlog.ErrCheckpointSignature)
	})
	t.Run("ErrOrigin", func(t *testing.T) {
		for _, origin := range []string{"other.example.com/default", "ledger.example.com", "ledger.example.com/", "ledger.example.comx/default"} {
			m, err := tlog.Sign(tlog.Checkpoint{Origin: origin, Size: 7, Root: tlog.EmptyRoot}, s)
			require.NoError(t, err)
			_, err = tlog.OpenCheckpoint(m, v, "")
			assert.ErrorIs(t, err, tlog.ErrCheckpointOrigin, origin)
		}
		_, err = tlog.OpenCheckpoint(msg, v, "payments")
		assert.ErrorIs(t, err, tlog.ErrCheckpointOrigin, "another namespace")
	})
	t.Run("ErrKeyName", func(t *testing.T) {
		_, _, _, err := tlog.LoadSignerText(skey, "other.example.com")
		assert.Error(t, err)
	})
}

// An OpenSSH Ed25519 private key signs as a note key named by the origin
// prefix; its verifier key is the note form of its public key.
func TestLoadSigner_OpenSSH(t *testing.T) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	block, err := ssh.MarshalPrivateKey(priv, "")
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "id_ed25519")
	require.NoError(t, os.WriteFile(path, pem.EncodeToMemory(block), 0o600))
	s, vkey, closeKey, err := tlog.LoadSigner(path, "ledger.example.com", tlog.KeyOptions{})
	require.NoError(t, err)
	defer func() { _ = closeKey() }()
	v, err := tlog.NewVerifier(vkey)
	require.NoError(t, err)
	msg, err := tlog.Sign(tlog.Checkpoint{Origin: "ledger.example.com/default", Size: 1, Root: tlog.EmptyRoot}, s)
	require.NoError(t, err)
	_, err = tlog.OpenCheckpoint(msg, v, "default")
	require.NoError(t, err)
	assert.Equal(t, v.KeyHash(), s.KeyHash())
	assert.True(t, ed25519.Verify(pub, []byte(tlog.Checkpoint{Origin: "ledger.example.com/default", Size: 1, Root: tlog.EmptyRoot}.Text()),
		mustSig(t, s)), "the signature is plain Ed25519 over the note text")

	t.Run("ErrNotEd25519", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "junk")
		require.NoError(t, os.WriteFile(p, []byte("not a key"), 0o600))
		_, _, _, err := tlog.LoadSigner(p, "ledger.example.com", tlog.KeyOptions{})
		assert.Error(t, err)
	})
	t.Run("ErrNotRegular", func(t *testing.T) {
		fifo := filepath.Join(t.TempDir(), "fifo")
		require.NoError(t, syscall.Mkfifo(fifo, 0o600))
		_, _, _, err := tlog.LoadSigner(fifo, "ledger.example.com", tlog.KeyOptions{})
		assert.ErrorIs(t, err, tlog.ErrKeyFile, "refused at once, never waiting for a writer")
		_, _, _, err = tlog.LoadSigner(t.TempDir(), "ledger.example.com", tlog.KeyOptions{})
		assert.ErrorIs(t, err, tlog.ErrKeyFile)
	})
	t.Run("ErrReadableByOthers", func(t *testing.T) {
		open := filepath.Join(t.TempDir(), "id_open")
		require.NoError(t, os.WriteFile(open, pem.EncodeToMemory(block), 0o600))
		require.NoError(t, os.Chmod(open, 0o640))
		_, _, _, err := tlog.LoadSigner(open, "ledger.example.com", tlog.KeyOptions{})
		assert.ErrorIs(t, err, tlog.ErrKeyFile)
		assert.ErrorContains(t, err, "chmod 600")
		var logs strings.Builder
		_, _, _, err = tlog.LoadSigner(open, "ledger.example.com",
			tlog.KeyOptions{AllowReadable: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		assert.NoError(t, err)
		assert.Contains(t, logs.String(), "level=WARN")
	})
	t.Run("ErrAgentWithoutSocket", func(t *testing.T) {
		t.Setenv("SSH_AUTH_SOCK", "")
		_, _, _, err := tlog.LoadSigner("ssh-agent:SHA256:abc", "ledger.example.com", tlog.KeyOptions{})
		assert.ErrorContains(t, err, "SSH_AUTH_SOCK")
	})
}

func mustSig(t *testing.T, s interface{ Sign([]byte) ([]byte, error) }) []byte {
	t.Helper()
	sig, err := s.Sign([]byte(tlog.Checkpoint{Origin: "ledger.example.com/default", Size: 1, Root: tlog.EmptyRoot}.Text()))
	require.NoError(t, err)
	return sig
}
