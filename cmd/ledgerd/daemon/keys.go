package daemon

import (
	"fmt"

	"golang.org/x/mod/sumdb/note"

	"github.com/effect-ledger/effect-ledger/tlog"
)

// signingKey holds the loaded checkpoint signing keys: --signing-key and,
// while the log hands over to it (SPEC §9.2), --handover-key, the key it
// replaces.
type signingKey struct {
	signers []note.Signer // --signing-key first
	vkeys   []string
	close   func()
}

// baseID is the id of the key this ledger signed with before a rotation:
// the handover key if given, else the signing key; "" without keys.
func (k *signingKey) baseID() string {
	if k == nil || len(k.signers) == 0 {
		return ""
	}
	return tlog.KeyID(k.signers[len(k.signers)-1])
}

// loadKeys loads --signing-key and --handover-key with --log-origin as
// their name.
func (m *Main) loadKeys() (*signingKey, error) {
	k := &signingKey{}
	var closers []func() error
	k.close = func() {
		for _, c := range closers {
			if err := c(); err != nil {
				m.Logger.Warn("close signing key", "err", err)
			}
		}
	}
	for _, spec := range []struct{ flag, path string }{{"--signing-key", m.SigningKey}, {"--handover-key", m.HandoverKey}} {
		if spec.path == "" {
			continue
		}
		signer, vkey, closeKey, err := tlog.LoadSigner(spec.path, m.LogOrigin,
			tlog.KeyOptions{AllowReadable: m.AllowReadableKey, Logger: m.Logger})
		closers = append(closers, closeKey)
		if err != nil {
			k.close()
			return nil, fmt.Errorf("%s: %w", spec.flag, err)
		}
		k.signers, k.vkeys = append(k.signers, signer), append(k.vkeys, vkey)
	}
	if len(k.signers) == 2 && k.signers[0].KeyHash() == k.signers[1].KeyHash() {
		k.close()
		return nil, fmt.Errorf("--handover-key is the --signing-key: hand over to a new key (ledgerctl keygen, docs/operations.md)")
	}
	return k, nil
}
