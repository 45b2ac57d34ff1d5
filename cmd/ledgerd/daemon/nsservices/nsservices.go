// Package nsservices runs ledgerd's per-namespace services, each started
// when its namespace is first seen: with a signing key the verifiable log
// (SPEC §9: a checkpoint signer and, with witnesses, the witnessing of its
// checkpoints), with a verification period the periodic verification (its
// metrics labelled by namespace), with a retention interval the payload
// retention sweeps, and the refresh of the ledger_payload_bytes gauge. New
// namespaces are looked for every ScanEvery.
package nsservices

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/mod/sumdb/note"

	"github.com/effect-ledger/effect-ledger/internal/tick"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/tlog"
	"github.com/effect-ledger/effect-ledger/verify"
)

// DefaultScanEvery is how often new namespaces are looked for unless
// Config.ScanEvery says otherwise.
const DefaultScanEvery = 2 * time.Second

// Config says which services run for each namespace.
type Config struct {
	// Ledger is where the namespaces are listed and opened.
	Ledger *ledger.Ledger
	Logger *slog.Logger

	// Signers sign each namespace's checkpoints: the signing key, then,
	// while the log hands over from it (SPEC §9.2), the key it replaces.
	// None: no checkpoints, and none of the fields up to VerifyStore
	// matter.
	Signers []note.Signer
	// VerifierKeys are the Signers' verifier keys, with which the
	// witnessing parses stored checkpoints.
	VerifierKeys []string
	// OriginPrefix names the logs: namespace NS has origin PREFIX/NS.
	OriginPrefix       string
	CheckpointInterval time.Duration
	// Witnesses cosign each new checkpoint; a checkpoint is served once
	// WitnessQuorum of them have.
	Witnesses     []*tlog.Witness
	WitnessQuorum int
	// SignerLock, when set, elects one signer per namespace among
	// replicas on one database: a replica signs only while it holds the
	// namespace's lock (see election), and takes it only while it holds
	// the key the chain announced last (SPEC §9.2).
	SignerLock func(ctx context.Context, ns string) (release func(), ok bool, err error)

	// VerifyStore is the read-only store the periodic verifications read
	// (never the API's or the writers' connections); nil: no periodic
	// verification.
	VerifyStore ledger.Store
	VerifyEvery time.Duration
	// Registerer receives the verifications' metrics, labelled by
	// namespace (default prometheus.DefaultRegisterer).
	Registerer prometheus.Registerer

	// ScanEvery is how often new namespaces are looked for (default
	// DefaultScanEvery).
	ScanEvery time.Duration

	// RetentionEvery is how often each namespace's payload retention is
	// swept (SPEC §14; 0: never), once it is committed (created so, or
	// switched by a policy since). With a SignerLock and signers, the
	// replica holding the namespace's signer lock sweeps (SPEC §14);
	// without, every replica does: a sweep runs under the namespace's head
	// lock, so a second one at once finds nothing.
	RetentionEvery time.Duration

	// Prune says this ledger has an archive directory (SPEC §16): with
	// PruneEvery, each namespace whose policy has an archive member is
	// archived and pruned every PruneEvery (0: only when asked); with a
	// SignerLock and signers, by the replica holding the namespace's
	// signer lock only. Unfinished deletions resume at start either way.
	Prune      bool
	PruneEvery time.Duration

	// PayloadBytesEvery is how often each namespace's ledger_payload_bytes
	// gauge is read from the store (SPEC §14; 0: never), the first time at
	// once. Every namespace reports it, an inline one 0 (its values are in
	// the chain; a policy may switch it to committed since). Every replica
	// reports it: it is a gauge of the shared database's state.
	PayloadBytesEvery time.Duration
}

// Services are the running per-namespace services.
type Services struct {
	cfg Config
	vs  []note.Verifier // the Signers' verifiers; nil: no witnesses

	mu         sync.Mutex
	elections  []*election
	running    map[string]bool
	witnessing map[string]*tlog.Witnessing
	periodic   map[string]*verify.Periodic

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Start starts the services of every namespace there is, then looks for
// new ones every cfg.ScanEvery until ctx is done or Stop is called. Its
// errors are the witnesses' verifier key's and the first scan's.
func Start(ctx context.Context, cfg Config) (*Services, error) {
	if cfg.ScanEvery <= 0 {
		cfg.ScanEvery = DefaultScanEvery
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.DefaultRegisterer
	}
	s := &Services{cfg: cfg, running: map[string]bool{},
		witnessing: map[string]*tlog.Witnessing{}, periodic: map[string]*verify.Periodic{}}
	if len(cfg.Signers) > 0 && len(cfg.Witnesses) > 0 {
		for _, vkey := range cfg.VerifierKeys {
			v, err := tlog.NewVerifier(vkey)
			if err != nil {
				return nil, fmt.Errorf("witness: %w", err)
			}
			s.vs = append(s.vs, v)
		}
		names := make([]string, len(cfg.Witnesses))
		for i, w := range cfg.Witnesses {
			names[i] = w.Name() + "=" + w.URL
		}
		cfg.Logger.Info("witnessing checkpoints", "witnesses", names, "quorum", cfg.WitnessQuorum)
	}
	if len(cfg.Signers) > 0 {
		cfg.Logger.Info("signing checkpoints", "origin_prefix", cfg.OriginPrefix, "verifier_key", cfg.VerifierKeys[0], "interval", cfg.CheckpointInterval)
	}
	if len(cfg.Signers) > 1 {
		cfg.Logger.Info("handing over: checkpoints carry the signatures of both keys", "handover_key", cfg.VerifierKeys[1],
			"key_id", tlog.KeyID(cfg.Signers[0]), "handover_key_id", tlog.KeyID(cfg.Signers[1]))
	}
	sctx, cancel := context.WithCancel(ctx)
	s.cancel = cancel
	if err := s.scan(sctx); err != nil {
		cancel()
		s.wg.Wait()
		return nil, err
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		tick.Every(sctx, s.cfg.ScanEvery, s.rescan)
	}()
	return s, nil
}

// rescan scans once more, logging a failure.
func (s *Services) rescan(ctx context.Context) {
	if err := s.scan(ctx); err != nil && ctx.Err() == nil {
		s.cfg.Logger.Warn("namespace services: listing namespaces", "err", err)
	}
}

// scan starts the services of namespaces that have none yet.
func (s *Services) scan(ctx context.Context) error {
	// Names only: the heads (ledger.Namespaces) would cost a read per
	// namespace on every scan.
	names, err := s.cfg.Ledger.Store().Namespaces(ctx)
	if err != nil {
		return err
	}
	for _, name := range names {
		s.mu.Lock()
		running := s.running[name]
		s.mu.Unlock()
		if running {
			continue
		}
		n, err := s.cfg.Ledger.NS(ctx, name)
		if err != nil {
			return err
		}
		if err := s.start(ctx, n); err != nil {
			return err
		}
	}
	return nil
}

// every runs fn for namespace n every d (first at once when now is set)
// until ctx ends, and marks n's services running.
func (s *Services) every(ctx context.Context, n *ledger.Namespace, d time.Duration, now bool, fn func(context.Context)) {
	s.mu.Lock()
	s.running[n.Name()] = true
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if now {
			fn(ctx)
		}
		tick.Every(ctx, d, fn)
	}()
}

// start starts the services of namespace n.
func (s *Services) start(ctx context.Context, n *ledger.Namespace) error {
	logger := s.cfg.Logger.With("namespace", n.Name())
	var e *election
	if len(s.cfg.Signers) > 0 && s.cfg.SignerLock != nil {
		// Replicas on one database: one signer per namespace at a time,
		// among those that hold the chain's current key.
		e = &election{try: s.cfg.SignerLock, ns: n.Name(), logger: logger, eligible: s.holdsCurrent(n)}
		s.mu.Lock()
		s.elections = append(s.elections, e)
		s.mu.Unlock()
	}
	if s.cfg.RetentionEvery > 0 {
		// Every namespace: an inline one's sweep only reads whether a
		// policy has switched it to committed payloads since (SPEC §14).
		// Replicas with a signer lock: its holder sweeps.
		s.every(ctx, n, s.cfg.RetentionEvery, false, func(ctx context.Context) {
			if leads(ctx, e, logger, "retention sweep") {
				sweep(ctx, n, logger)
			}
		})
	}
	s.startPrune(ctx, n, logger, e)
	if s.cfg.PayloadBytesEvery > 0 {
		s.every(ctx, n, s.cfg.PayloadBytesEvery, true, func(ctx context.Context) { refreshPayloadBytes(ctx, n, logger) })
	}
	if s.cfg.VerifyStore != nil {
		c, err := s.cfg.VerifyStore.Chain(ctx, n.Name())
		if err != nil {
			return err
		}
		p := &verify.Periodic{Src: c, Every: s.cfg.VerifyEvery, Logger: logger.With("component", "verify"),
			Registerer: prometheus.WrapRegistererWith(prometheus.Labels{"namespace": n.Name()}, s.cfg.Registerer)}
		s.mu.Lock()
		s.periodic[n.Name()] = p
		s.running[n.Name()] = true
		s.mu.Unlock()
		s.wg.Add(1)
		go func() { defer s.wg.Done(); p.Run(ctx) }()
	}
	if len(s.cfg.Signers) == 0 {
		return nil
	}
	s.startLog(ctx, n, logger, e)
	return nil
}

// sweep runs n's retention sweeps until one finds less than a full sweep.
func sweep(ctx context.Context, n *ledger.Namespace, logger *slog.Logger) {
	for ctx.Err() == nil {
		res, err := n.Sweep(ctx)
		if err != nil {
			logger.Warn("retention sweep failed", "err", err)
			return
		}
		if res == nil || !res.More {
			return
		}
	}
}

// refreshPayloadBytes sets n's ledger_payload_bytes gauge from the store,
// logging a failure (the gauge then keeps its last value).
func refreshPayloadBytes(ctx context.Context, n *ledger.Namespace, logger *slog.Logger) {
	if _, err := n.RefreshPayloadBytes(ctx); err != nil && ctx.Err() == nil {
		logger.Warn("reading the payload bytes kept failed", "err", err)
	}
}

// startLog starts namespace n's checkpoint signer and, with witnesses,
// its witnessing.
func (s *Services) startLog(ctx context.Context, n *ledger.Namespace, logger *slog.Logger, e *election) {
	origin := tlog.Origin(s.cfg.OriginPrefix, n.Name())
	cp := &tlog.Checkpointer{Store: n, Signer: s.cfg.Signers[0], Origin: origin, Interval: s.cfg.CheckpointInterval,
		Logger: logger.With("component", "checkpoint"), Namespace: n.Name(),
		Active: func(ctx context.Context) (func(string) bool, error) {
			h, err := n.KeyHistory(ctx)
			return h.Active, err
		}}
	if len(s.cfg.Signers) > 1 {
		cp.Handover = s.cfg.Signers[1]
	}
	if e != nil {
		cp.Lead = e.lead
	}
	s.mu.Lock()
	s.running[n.Name()] = true
	var ws *tlog.Witnessing
	if s.vs != nil {
		ws = &tlog.Witnessing{Source: n, Verifier: s.vs[0], Witnesses: s.cfg.Witnesses, Quorum: s.cfg.WitnessQuorum,
			Interval: s.cfg.CheckpointInterval, Logger: logger.With("component", "witness")}
		if len(s.vs) > 1 {
			ws.Handover = s.vs[1]
		}
		s.witnessing[n.Name()] = ws
	}
	s.mu.Unlock()
	s.wg.Add(1)
	go func() { defer s.wg.Done(); cp.Run(ctx) }()
	if ws != nil {
		s.wg.Add(1)
		go func() { defer s.wg.Done(); ws.Run(ctx) }()
	}
}

// holdsCurrent returns whether this process holds the key namespace n's
// chain announced last (any key while it announces none).
func (s *Services) holdsCurrent(n *ledger.Namespace) func(ctx context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		h, err := n.KeyHistory(ctx)
		if err != nil || h.Current() == "" {
			return err == nil, err
		}
		for _, k := range s.cfg.Signers {
			if tlog.KeyID(k) == h.Current() {
				return true, nil
			}
		}
		return false, nil
	}
}

// Verification returns the periodic verification of namespace ns, or nil.
func (s *Services) Verification(ns string) *verify.Periodic {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.periodic[ns]
}

// Served is the checkpoint of namespace ns cosigned by the witness
// quorum, or nil.
func (s *Services) Served(ns string) *tlog.Signed {
	s.mu.Lock()
	ws := s.witnessing[ns]
	s.mu.Unlock()
	if ws == nil {
		return nil
	}
	return ws.Served()
}

// Stop stops every service, waits for them to end, and gives up the
// signer locks held.
func (s *Services) Stop() {
	s.cancel()
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.elections {
		e.resign()
	}
}
