package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/mod/sumdb/note"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/tlog"
	"github.com/effect-ledger/effect-ledger/verify"
)

// nsServices runs the per-namespace services, each started when its
// namespace is first seen: with --signing-key the verifiable log (SPEC
// §9: a checkpoint signer and, with --witness, the witnessing of its
// checkpoints), with --verify-every the periodic verification (its
// metrics labelled by namespace).
type nsServices struct {
	m   *Main
	l   *ledger.Ledger
	key *signingKey   // nil: no checkpoints
	v   note.Verifier // nil: no witnesses
	// rstore is the read-only store the verifications read (never the
	// API's or the writers' connections); nil: no periodic verification.
	rstore ledger.Store

	mu         sync.Mutex
	elections  []*election
	running    map[string]bool
	witnessing map[string]*tlog.Witnessing
	periodic   map[string]*verify.Periodic

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// namespaceScan is how often new namespaces are looked for.
const namespaceScan = 2 * time.Second

func (m *Main) startNsServices(ctx context.Context, l *ledger.Ledger, key *signingKey, rstore ledger.Store) (*nsServices, error) {
	s := &nsServices{m: m, l: l, key: key, rstore: rstore, running: map[string]bool{},
		witnessing: map[string]*tlog.Witnessing{}, periodic: map[string]*verify.Periodic{}}
	if key != nil && len(m.Witnesses.list) > 0 {
		v, err := tlog.NewVerifier(key.vkey)
		if err != nil {
			return nil, fmt.Errorf("witness: %w", err)
		}
		s.v = v
		names := make([]string, len(m.Witnesses.list))
		for i, w := range m.Witnesses.list {
			names[i] = w.Name() + "=" + w.URL
		}
		m.Logger.Info("witnessing checkpoints", "witnesses", names, "quorum", m.WitnessQuorum)
	}
	if key != nil {
		m.Logger.Info("signing checkpoints", "origin_prefix", m.LogOrigin, "verifier_key", key.vkey, "interval", m.CheckpointInterval)
	}
	every, err := testPeriod(testNamespaceScanEnv, namespaceScan)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	s.cancel = cancel
	if err := s.scan(sctx); err != nil {
		cancel()
		return nil, err
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
				if err := s.scan(sctx); err != nil && sctx.Err() == nil {
					m.Logger.Warn("namespace services: listing namespaces", "err", err)
				}
			}
		}
	}()
	return s, nil
}

// scan starts the services of namespaces that have none yet.
func (s *nsServices) scan(ctx context.Context) error {
	// Names only: the heads (ledger.Namespaces) would cost a read per
	// namespace on every scan.
	names, err := s.l.Store().Namespaces(ctx)
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
		n, err := s.l.NS(ctx, name)
		if err != nil {
			return err
		}
		if err := s.start(ctx, n); err != nil {
			return err
		}
	}
	return nil
}

func (s *nsServices) start(ctx context.Context, n *ledger.Namespace) error {
	logger := s.m.Logger.With("namespace", n.Name())
	if s.rstore != nil {
		c, err := s.rstore.Chain(ctx, n.Name())
		if err != nil {
			return err
		}
		src, err := verify.Of(c)
		if err != nil {
			return err
		}
		p := &verify.Periodic{Src: src, Every: s.m.VerifyEvery, Logger: logger.With("component", "verify"),
			Registerer: prometheus.WrapRegistererWith(prometheus.Labels{"namespace": n.Name()}, prometheus.DefaultRegisterer)}
		s.mu.Lock()
		s.periodic[n.Name()] = p
		s.running[n.Name()] = true
		s.mu.Unlock()
		s.wg.Add(1)
		go func() { defer s.wg.Done(); p.Run(ctx) }()
	}
	if s.key == nil {
		return nil
	}
	origin := tlog.Origin(s.m.LogOrigin, n.Name())
	cp := &tlog.Checkpointer{Store: n, Signer: s.key.signer, Origin: origin, Interval: s.m.CheckpointInterval,
		Logger: logger.With("component", "checkpoint"), Namespace: n.Name()}
	if sl, ok := s.l.Store().(signerLocker); ok {
		// Replicas on one database: one signer per namespace at a time.
		e := &election{try: sl.TrySignerLock, ns: n.Name(), logger: logger}
		cp.Lead = e.lead
		s.mu.Lock()
		s.elections = append(s.elections, e)
		s.mu.Unlock()
	}
	s.mu.Lock()
	s.running[n.Name()] = true
	var ws *tlog.Witnessing
	if s.v != nil {
		ws = &tlog.Witnessing{Source: n, Verifier: s.v, Witnesses: s.m.Witnesses.list, Quorum: s.m.WitnessQuorum,
			Interval: s.m.CheckpointInterval, Logger: logger.With("component", "witness")}
		s.witnessing[n.Name()] = ws
	}
	s.mu.Unlock()
	s.wg.Add(1)
	go func() { defer s.wg.Done(); cp.Run(ctx) }()
	if ws != nil {
		s.wg.Add(1)
		go func() { defer s.wg.Done(); ws.Run(ctx) }()
	}
	return nil
}

// Verification returns the periodic verification of namespace ns, or nil.
func (s *nsServices) Verification(ns string) *verify.Periodic {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.periodic[ns]
}

// Served is the checkpoint of namespace ns cosigned by the witness
// quorum, or nil.
func (s *nsServices) Served(ns string) *tlog.Signed {
	s.mu.Lock()
	ws := s.witnessing[ns]
	s.mu.Unlock()
	if ws == nil {
		return nil
	}
	return ws.Served()
}

func (s *nsServices) stop() {
	s.cancel()
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.elections {
		e.resign()
	}
}

// signerLocker is a store shared by replicas that elects one checkpoint
// signer per namespace (the PostgreSQL driver: a session advisory lock,
// freed when the holder's connection ends).
type signerLocker interface {
	TrySignerLock(ctx context.Context, ns string) (release func(), ok bool, err error)
}

// election holds the signer lock of one namespace once won.
type election struct {
	try     func(ctx context.Context, ns string) (func(), bool, error)
	ns      string
	logger  *slog.Logger
	mu      sync.Mutex
	release func()
}

func (e *election) lead(ctx context.Context) (bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.release != nil {
		return true, nil
	}
	release, ok, err := e.try(ctx, e.ns)
	if err != nil || !ok {
		return false, err
	}
	e.release = release
	e.logger.Info("this replica signs the namespace's checkpoints")
	return true, nil
}

func (e *election) resign() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.release != nil {
		e.release()
		e.release = nil
	}
}
