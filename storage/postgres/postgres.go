// Package postgres is the PostgreSQL storage driver of the ledger: a
// ledger.Store over one PostgreSQL database that several ledgerd
// processes (replicas) may share at once (SPEC §10).
//
// Each namespace's chain is serialised by its row in the head table:
// Store.Write locks it FOR UPDATE, runs the batch's operations, writes the
// batch's receipts, key records, tree hashes and checkpoint in one
// pipelined round trip ending with a compare-and-set of the head row, and
// commits. Serialization failures, deadlocks and connections lost before
// COMMIT are retried by re-running the whole function; a COMMIT whose
// reply is lost is resolved by looking up the batch's id once the old
// backend is gone, so that a batch is never appended twice.
//
// The driver caches nothing another replica can change: no head, no key
// records. Only tree hashes (immutable once committed) are cached.
package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// Options configure Open.
type Options struct {
	// ReadOnly opens the store for reading: no schema is created and
	// Write returns ledger.ErrOpenedReadOnly.
	ReadOnly bool
	// Logger receives the driver's logs; nil discards them.
	Logger *slog.Logger
	// Now replaces the database clock, for tests only. By default the
	// time of a write transaction (Tx.Now) and of GetKey's state is the
	// database server's clock, the same for every replica.
	Now func() time.Time
	// MaxConns caps the connection pool; 0 keeps the URL's pool_max_conns
	// or pgxpool's default.
	MaxConns int32
	// KeyTTL is the key_ttl_ms (SPEC §12) of the default namespace when
	// Open creates the schema (ledgerd --default-key-ttl); an existing
	// database keeps its own. 0: keys never expire.
	KeyTTL uint64
	// Payloads is the payload mode (SPEC §14) of the default namespace when
	// Open creates the schema ("": ledger.DefaultPayloads).
	Payloads ledger.PayloadMode
}

// Store is a ledger.Store on a PostgreSQL database.
type Store struct {
	pool *pgxpool.Pool
	cfg  *pgxpool.Config
	opts Options
	log  *slog.Logger
	desc string
	id   string // this Store's id in NOTIFY payloads
	// version is the database's schema version: a read-only store reads
	// a version 1 schema (no key_ttl_ms) as it is.
	version int

	mu      sync.Mutex
	known   map[string]*Chain // namespaces known to exist (never deleted)
	onEnded []func(ns string, keys []string)
	listen  *listener
	closed  bool
	updates uint64 // Updates committed, for pruning batches
	// analyzing: an analyzeYoung run is under way, which started at
	// analyzedAt (unix ns); noAnalyze: one failed, autovacuum alone keeps
	// the statistics.
	analyzing, noAnalyze atomic.Bool
	vacuuming            atomic.Bool        // a VACUUM after a prune runs (prunedelete.go)
	bgCtx                context.Context    // ends at Close: background work stops
	bgCancel             context.CancelFunc //
	analyzedAt           atomic.Int64
	trees                map[string]*treeCache
	testHook             testHooks
}

func (s *Store) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// testHooks are set by the package's tests only.
type testHooks struct {
	beforeCommit func(pid uint32) // called with the writer's backend pid just before COMMIT
}

var (
	_ ledger.Store       = (*Store)(nil)
	_ ledger.Chain       = (*Chain)(nil)
	_ ledger.Tx          = (*tx)(nil)
	_ ledger.TokenStore  = tokenStore{}
	_ ledger.ChainReader = (*Chain)(nil)
)

// IsURL reports whether dsn names a PostgreSQL database
// (postgres:// or postgresql://).
func IsURL(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

// Redact returns dsn for logs and errors: the password of its user info
// and of a password= parameter replaced by xxxxx. A dsn that does not parse
// is reduced to its scheme.
func Redact(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		// Keep what names the server: scheme://host:port/database, cut
		// by hand, the user info and the parameters left out.
		scheme, rest, ok := strings.Cut(dsn, "://")
		if !ok || len(scheme) > 16 {
			return "(malformed URL)"
		}
		if i := strings.LastIndexByte(rest, '@'); i >= 0 {
			rest = rest[i+1:] // a password may hold '/', '?' or '#'
		}
		rest, _, _ = strings.Cut(rest, "?")
		return scheme + "://" + rest
	}
	q := u.Query()
	if q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}

// Open connects to the PostgreSQL database named by dsn (postgres:// or
// postgresql://), checks its schema version and, unless opts.ReadOnly,
// creates the schema on an empty database. Errors name the host and
// database but never the password; a schema newer than this build wraps
// ledger.ErrSchemaVersion, an unreachable server ledger.ErrUnavailable.
func Open(ctx context.Context, dsn string, opts Options) (*Store, error) {
	desc := Redact(dsn)
	if !IsURL(dsn) {
		return nil, fmt.Errorf("open postgres %s: the URL must start with postgres:// or postgresql://", desc)
	}
	if _, err := url.Parse(dsn); err != nil {
		// url.Error repeats the URL, and its cause may quote a piece of
		// it that is really a password (an unescaped '/' in the password
		// makes the rest parse as a host and port): show the cause only
		// when the URL has no user info.
		var ue *url.Error
		if errors.As(err, &ue) && !strings.Contains(dsn, "@") {
			return nil, fmt.Errorf("open postgres %s: malformed URL: %v", desc, ue.Err)
		}
		return nil, fmt.Errorf("open postgres %s: malformed URL (check the host, the port and the %%-escapes; "+
			"reserved characters in a user name or password must be percent-encoded)", desc)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("open postgres %s: %s", desc, safeMessage(err, dsn))
	}
	desc = describe(cfg)
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	if opts.MaxConns > 0 {
		cfg.MaxConns = opts.MaxConns
	}
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = "ledgerd"
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	s := &Store{cfg: cfg, opts: opts, log: log, desc: desc, id: hex.EncodeToString(id[:]),
		known: map[string]*Chain{}, trees: map[string]*treeCache{}}
	s.bgCtx, s.bgCancel = context.WithCancel(context.Background())
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open postgres %s: %s", desc, safeMessage(err, dsn))
	}
	s.pool = pool
	conn, err := pool.Acquire(ctx)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("open postgres %s: %w", desc, safeErr(classify(err), dsn))
	}
	s.version, err = migrate(ctx, conn.Conn(), opts.ReadOnly, ledger.NamespaceSettings{KeyTTL: opts.KeyTTL, Payloads: opts.Payloads})
	if err == nil && !opts.ReadOnly {
		err = checkHeads(ctx, conn.Conn())
	}
	conn.Release()
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("open postgres %s: %w", desc, safeErr(classify(err), dsn))
	}
	log.Info("postgres: opened", "db", desc, "read_only", opts.ReadOnly, "schema_version", SchemaVersion)
	return s, nil
}

// describe names the database of cfg: user@host:port/database.
func describe(cfg *pgxpool.Config) string {
	c := cfg.ConnConfig
	host := c.Host
	if strings.HasPrefix(host, "/") {
		host = "unix:" + host
	}
	return fmt.Sprintf("postgres://%s@%s:%d/%s", c.User, host, c.Port, c.Database)
}

// safeMessage is err's text with the password of dsn cut out, should a
// library ever repeat it.
func safeMessage(err error, dsn string) string {
	msg := err.Error()
	for _, pw := range passwords(dsn) {
		msg = strings.ReplaceAll(msg, pw, "xxxxx")
	}
	return msg
}

// safeErr keeps err (for errors.Is) unless its text holds a password.
func safeErr(err error, dsn string) error {
	if msg := safeMessage(err, dsn); msg != err.Error() {
		return &redactedError{msg: msg, err: err}
	}
	return err
}

type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

func passwords(dsn string) []string {
	u, err := url.Parse(dsn)
	if err != nil {
		return nil
	}
	var out []string
	if pw, ok := u.User.Password(); ok && pw != "" {
		out = append(out, pw)
	}
	if pw := u.Query().Get("password"); pw != "" {
		out = append(out, pw)
	}
	return out
}

// Describe names the database for logs and errors (never a password).
func (s *Store) Describe() string { return s.desc }

// Close stops the LISTEN connection and closes the pool.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	l := s.listen
	s.mu.Unlock()
	if s.bgCancel != nil {
		s.bgCancel()
	}
	if l != nil {
		l.stop()
	}
	s.pool.Close()
	return nil
}

// Chain returns the namespace ns, or ledger.ErrUnknownNamespace.
func (s *Store) Chain(ctx context.Context, ns string) (ledger.Chain, error) {
	return s.chain(ctx, ns)
}

func (s *Store) chain(ctx context.Context, ns string) (*Chain, error) {
	s.mu.Lock()
	c, ok := s.known[ns]
	s.mu.Unlock()
	if ok {
		return c, nil
	}
	var exists bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM namespaces WHERE name = $1)`, ns).Scan(&exists)
	if err != nil {
		return nil, fmt.Errorf("namespace %s: %w", ns, classify(err))
	}
	if !exists {
		return nil, fmt.Errorf("%w: %s", ledger.ErrUnknownNamespace, ns)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.known[ns]; ok {
		return c, nil
	}
	c = &Chain{s: s, ns: ns}
	s.known[ns] = c
	return c, nil
}

// CreateNamespace creates an empty namespace with settings st, or returns
// ledger.ErrNamespaceExists.
func (s *Store) CreateNamespace(ctx context.Context, ns string, st ledger.NamespaceSettings) error {
	if s.opts.ReadOnly {
		return ledger.ErrOpenedReadOnly
	}
	err := createNamespace(ctx, s.pool, ns, st)
	if isCode(err, codeUniqueViolation) {
		return fmt.Errorf("%w: %s", ledger.ErrNamespaceExists, ns)
	}
	if isCode(err, codeCheckViolation) {
		return fmt.Errorf("create namespace: invalid name %q", ns)
	}
	if err != nil {
		return fmt.Errorf("create namespace %s: %w", ns, classify(err))
	}
	return nil
}

// Namespaces lists the namespaces by name (byte order).
func (s *Store) Namespaces(ctx context.Context) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT name FROM namespaces ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("namespaces: %w", classify(err))
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("namespaces: %w", classify(err))
	}
	return out, nil
}

// Tokens is the table of API tokens.
func (s *Store) Tokens() ledger.TokenStore { return tokenStore{s} }

// now returns Options.Now in unix ms, or false to use the database clock.
func (s *Store) now() (uint64, bool) {
	if s.opts.Now == nil {
		return 0, false
	}
	return uint64(s.opts.Now().UnixMilli()), true
}
