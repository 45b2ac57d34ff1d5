package daemon

import (
	"context"
	"time"

	"github.com/effect-ledger/effect-ledger/cmd/ledgerd/daemon/nsservices"
)

// startNsServices starts the per-namespace services of the flags: with
// --signing-key the verifiable log, with --verify-every the periodic
// verification over the read-only store, with --retention-interval the
// retention sweeps, with --archive-dir the scheduled prunes, and always
// the ledger_payload_bytes gauge and the resumption of unfinished prunes.
func (m *Main) startNsServices(ctx context.Context, o *opened, key *signingKey) (*nsservices.Services, error) {
	cfg := nsservices.Config{Ledger: o.l, Logger: m.Logger, ScanEvery: m.NamespaceScanEvery}
	if key != nil {
		cfg.Signers, cfg.VerifierKeys = key.signers, key.vkeys
		cfg.OriginPrefix, cfg.CheckpointInterval = m.LogOrigin, m.CheckpointInterval
		cfg.Witnesses, cfg.WitnessQuorum = m.Witnesses.list, m.WitnessQuorum
		if o.shared != nil { // one signer per namespace among the replicas
			cfg.SignerLock = o.shared.TrySignerLock
		}
	}
	if m.VerifyEvery > 0 {
		cfg.VerifyStore, cfg.VerifyEvery = o.rstore, m.VerifyEvery
	}
	cfg.RetentionEvery = m.RetentionEvery
	cfg.Prune, cfg.PruneEvery = m.ArchiveDir != "", m.PruneInterval
	if m.PruneEvery > 0 {
		cfg.PruneEvery = m.PruneEvery
	}
	// ledger_payload_bytes is read as often as retention is swept (what
	// the sweeps delete shows at once), every minute when they are off.
	cfg.PayloadBytesEvery = m.RetentionEvery
	if cfg.PayloadBytesEvery <= 0 {
		cfg.PayloadBytesEvery = time.Minute
	}
	return nsservices.Start(ctx, cfg)
}
