package ledger

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
)

var namespaceName = regexp.MustCompile(`^[a-z0-9._-]{1,64}$`)

// ValidNamespace reports whether name is a namespace name (SPEC §7:
// 1–64 bytes of a-z 0-9 . _ -).
func ValidNamespace(name string) bool { return namespaceName.MatchString(name) }

// CheckNamespace returns a 400 invalid_request *Error for a name outside
// the namespace alphabet.
func CheckNamespace(name string) error {
	if !ValidNamespace(name) {
		return &Error{Code: ECodeInvalidRequest,
			Message: "namespace names are 1–64 bytes of a-z 0-9 . _ -",
			Details: map[string]any{"field": "namespace"}}
	}
	return nil
}

// NS returns the namespace name: a 400 *Error for an invalid name,
// 404 unknown_namespace for one that was never created.
func (l *Ledger) NS(ctx context.Context, name string) (*Namespace, error) {
	l.mu.Lock()
	n := l.spaces[name] // a name found is valid: only checked names are added
	closed := l.closed
	l.mu.Unlock()
	if n != nil {
		return n, nil
	}
	if err := CheckNamespace(name); err != nil {
		return nil, err
	}
	if closed {
		return nil, ErrClosed
	}
	c, err := l.store.Chain(ctx, name)
	if errors.Is(err, ErrUnknownNamespace) {
		return nil, &Error{Code: ECodeUnknownNamespace, Message: fmt.Sprintf("no namespace %q", name),
			Details: map[string]any{"namespace": name}}
	}
	if err != nil {
		return nil, err
	}
	ttl, err := c.KeyTTL(ctx) // fixed at creation: read once
	if err != nil {
		return nil, err
	}
	mode, err := c.Payloads(ctx)
	if err != nil {
		return nil, err
	}
	if mode != PayloadsInline && mode != PayloadsCommitted {
		return nil, fmt.Errorf("namespace %q: payload mode %q: %w (use a newer ledgerd)", name, mode, ErrUnsupported)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := l.spaces[name]; n != nil {
		return n, nil
	}
	if l.closed {
		return nil, ErrClosed
	}
	c = KeptChain(c)
	n = &Namespace{Log: Log{ChainReader: c, Payloads: c}, l: l, name: name, chain: c, keyTTL: ttl, payloads: mode}
	l.spaces[name] = n
	return n, nil
}

// Default returns the default namespace.
func (l *Ledger) Default(ctx context.Context) (*Namespace, error) {
	return l.NS(ctx, DefaultNamespace)
}

// MaxKeyTTL bounds key_ttl_ms: integers up to it are exact in every
// JSON client.
const MaxKeyTTL = 1<<53 - 1

// CreateNamespace creates an empty namespace whose keys expire s.KeyTTL ms
// after their outcome (0: never; SPEC §12) and whose payloads are kept as
// s.Payloads says ("": DefaultPayloads, SPEC §14): 400 for an invalid name, TTL
// or mode, 409 namespace_exists for one that exists.
func (l *Ledger) CreateNamespace(ctx context.Context, name string, s NamespaceSettings) error {
	if err := CheckNamespace(name); err != nil {
		return err
	}
	var err error
	if s.Payloads, err = ParsePayloadMode(string(s.Payloads), DefaultPayloads); err != nil {
		return err
	}
	keyTTL := s.KeyTTL
	if keyTTL > MaxKeyTTL {
		return Invalid("key_ttl_ms", "key_ttl_ms must be an integer from 0 to %d", uint64(MaxKeyTTL))
	}
	if max := l.cfg.MaxNamespaces; max > 0 {
		l.createMu.Lock()
		defer l.createMu.Unlock()
		names, err := l.store.Namespaces(ctx)
		if err != nil {
			return err
		}
		if len(names) >= max && !slices.Contains(names, name) {
			return &Error{Code: ECodeNamespaceLimit,
				Message: fmt.Sprintf("this server holds at most %d namespaces (ledgerd --max-namespaces)", max),
				Details: map[string]any{"namespace": name, "max_namespaces": max}}
		}
	}
	err = l.store.CreateNamespace(ctx, name, s)
	switch {
	case errors.Is(err, ErrNamespaceExists):
		return &Error{Code: ECodeNamespaceExists, Message: fmt.Sprintf("namespace %q exists", name),
			Details: map[string]any{"namespace": name}}
	case errors.Is(err, ErrNamespaceLost):
		// Storage of that name holds history the ledger does not know.
		l.logger.Warn("namespace not created", "namespace", name, "err", err)
		return &Error{Code: ECodeNamespaceExists,
			Message: fmt.Sprintf("storage for namespace %q already holds receipts the ledger does not know; an operator must move it away", name),
			Details: map[string]any{"namespace": name}}
	}
	if err == nil {
		l.logger.Info("namespace created", "namespace", name, "key_ttl_ms", keyTTL, "payloads", s.Payloads)
	}
	return err
}

// NamespaceInfo is one namespace, its head, its key_ttl_ms and its
// payload mode in force.
type NamespaceInfo struct {
	Name     string
	Head     Head
	KeyTTL   uint64 // ms; 0: keys never expire
	Payloads PayloadMode
	// SwitchedAt is the seq of the policy receipt that switched the
	// namespace from inline to committed payloads: the receipts after it
	// are committed (0: created committed, or inline).
	SwitchedAt uint64
}

// Namespaces lists every namespace with its head, by name.
func (l *Ledger) Namespaces(ctx context.Context) ([]NamespaceInfo, error) {
	names, err := l.store.Namespaces(ctx)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	out := make([]NamespaceInfo, 0, len(names))
	for _, name := range names {
		c, err := l.store.Chain(ctx, name)
		if errors.Is(err, ErrUnknownNamespace) {
			continue
		}
		if err != nil {
			return nil, err
		}
		h, err := c.Head(ctx)
		if err != nil {
			return nil, err
		}
		ttl, err := c.KeyTTL(ctx)
		if err != nil {
			return nil, err
		}
		mode, at, err := PayloadsOf(ctx, c)
		if err != nil {
			return nil, err
		}
		out = append(out, NamespaceInfo{Name: name, Head: h, KeyTTL: ttl, Payloads: mode, SwitchedAt: at})
	}
	return out, nil
}

// Namespace is one namespace of a Ledger: its writes and reads.
type Namespace struct {
	Log // reads and proofs, without the head lock

	l        *Ledger
	name     string
	chain    Chain
	keyTTL   uint64                 // key_ttl_ms, fixed at creation
	payloads PayloadMode            // fixed at creation (SPEC §14)
	fpKey    atomic.Pointer[[]byte] // the fingerprint key, once read (fingerprint.go)
	// sw is what an inline namespace knows of its switch to committed
	// payloads (payloadswitch.go).
	sw atomic.Pointer[switchState]

	failLog failLog // spaces the log lines of a batch failure that repeats

	// policies caches parsed policy receipts by seq (SPEC §13; a policy
	// receipt never changes); lastPolicy is the seq the last batch read.
	policies   sync.Map // uint64 → *Policy
	lastPolicy atomic.Uint64
	policySeen atomic.Bool   // lastPolicy was read from the chain once
	lastPurge  atomic.Uint64 // unix ms of the last purge of asked inputs (gate.go)

	keys keyHistoryCache // the key receipts read so far (signingkeys.go)

	// prunedPol is the policy the latest committed prune receipt carries
	// (prune.go), once read; deleting serialises the deletion of bodies.
	prunedPol atomic.Pointer[prunedPolicy]
	pruning   sync.Mutex // one Prune at a time
	deleting  sync.Mutex // one DeletePruned at a time
}

// purgeEvery is how often a namespace's writes purge its asked inputs.
const purgeEvery = 60_000

// purgeDue reports whether the asked inputs are to be purged at now (unix
// ms), and if so marks them purged.
func (n *Namespace) purgeDue(now uint64) bool {
	last := n.lastPurge.Load()
	return now >= last+purgeEvery && n.lastPurge.CompareAndSwap(last, now)
}

// Name is the namespace's name.
func (n *Namespace) Name() string { return n.name }

// Reader reads the namespace without its head lock.
func (n *Namespace) Reader() ChainReader { return n.chain }

// Audit reads the namespace as the verifier does (verify.DB).
func (n *Namespace) Audit() Audited {
	if k, ok := n.chain.(keptChain); ok {
		return k.Chain
	}
	return n.chain
}
