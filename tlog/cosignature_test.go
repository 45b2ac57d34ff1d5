package tlog_test

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	fnote "github.com/transparency-dev/formats/note"
	"golang.org/x/mod/sumdb/note"

	"github.com/effect-ledger/effect-ledger/tlog"
)

// TestCosignature_CrossCheck checks the cosignature/v1 signer and
// verifier against an independent implementation
// (github.com/transparency-dev/formats/note, a test-only dependency):
// same key id, and each side verifies the other's signature lines.
func TestCosignature_CrossCheck(t *testing.T) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	const name = "witness.example.org/w1"
	ours := tlog.NewCosignatureSigner(name, priv)
	theirs, err := fnote.NewSignerForCosignatureV1(fmt.Sprintf("PRIVATE+KEY+%s+%08x+%s", name, ours.KeyHash(),
		base64.StdEncoding.EncodeToString(append([]byte{0x04}, priv.Seed()...))))
	require.NoError(t, err)
	require.Equal(t, ours.KeyHash(), theirs.KeyHash(), "the same key id")

	theirV, err := fnote.NewVerifierForCosignatureV1(ours.VerifierKey())
	require.NoError(t, err)
	ourV, err := tlog.NewCosignatureVerifier(ours.VerifierKey())
	require.NoError(t, err)

	text := "log.example.com/default\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
	for _, tt := range []struct {
		desc   string
		signer note.Signer
		v      note.Verifier
	}{
		{"ours verified by theirs", ours, theirV},
		{"theirs verified by ours", theirs, ourV},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			msg, err := note.Sign(&note.Note{Text: text}, tt.signer)
			require.NoError(t, err)
			n, err := note.Open(msg, note.VerifierList(tt.v))
			require.NoError(t, err)
			require.Len(t, n.Sigs, 1)
			_, err = fnote.CoSigV1Timestamp(n.Sigs[0])
			require.NoError(t, err, "a cosignature/v1 timestamp")
			tampered := bytes.Replace(msg, []byte("\n20852163\n"), []byte("\n20852164\n"), 1)
			_, err = note.Open(tampered, note.VerifierList(tt.v))
			var ie *note.InvalidSignatureError
			require.ErrorAs(t, err, &ie, "another tree size does not verify")
		})
	}
}
