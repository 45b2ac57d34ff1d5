package ledger

import (
	"context"
	"errors"
	"fmt"

	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// The ports between the domain (this package: validation, the SPEC §4
// state machine, hashing, the batching queue, waits, proofs) and a
// storage driver (storage/sqlite, storage/postgres). A driver owns
// transactions, locks, retries and caches; it never hashes and never
// decides. What it may cache depends on who else writes: the SQLite
// driver is the only writer of its files and caches key records and the
// head; the PostgreSQL driver shares its database with other replicas and
// caches nothing another replica can change.

// DefaultNamespace is the namespace that always exists; the unprefixed
// routes serve it (SPEC §7).
const DefaultNamespace = "default"

// Storage errors.
var (
	// ErrUnknownNamespace: the namespace was never created.
	ErrUnknownNamespace = errors.New("unknown namespace")
	// ErrNamespaceExists: CreateNamespace of a name that exists.
	ErrNamespaceExists = errors.New("namespace exists")
	// ErrOpenedReadOnly: a write through a store opened for reading.
	ErrOpenedReadOnly = errors.New("the ledger is open for reading only")
	// ErrCommitUnknown: the database did not confirm a COMMIT and could
	// not be asked whether it happened; wraps ErrUnavailable.
	ErrCommitUnknown = fmt.Errorf("the outcome of a commit is unknown: %w", ErrUnavailable)
	// ErrStaleCheckpoint: a checkpoint not larger than the stored one
	// (another replica signed that size first).
	ErrStaleCheckpoint = tlog.ErrStale
)

// Store is a storage driver's handle on one database (a SQLite file and
// its namespace files, or a PostgreSQL database).
type Store interface {
	// Write is the one write port: it runs each batch's operations
	// (Batch.Run, which may run more than once: each run starts from the
	// database and keeps nothing from an earlier one) in one write
	// transaction that holds every batch's head exclusively, and returns
	// after one durable COMMIT. The batches are of distinct namespaces. A
	// failure of one batch's run rolls the whole write back and comes back
	// as a *PartError naming it; so does a refusal by the database that may
	// be some batches' own, not all of theirs (Part -1 when the driver
	// cannot tell whose). Any other error means nothing persisted.
	Write(ctx context.Context, batches []Batch) error
	// Chain returns the namespace ns, or ErrUnknownNamespace.
	Chain(ctx context.Context, ns string) (Chain, error)
	// CreateNamespace creates an empty namespace with settings s (valid),
	// or returns ErrNamespaceExists. The name is valid (ValidNamespace).
	CreateNamespace(ctx context.Context, ns string, s NamespaceSettings) error
	// Namespaces lists the namespaces by name, DefaultNamespace included.
	Namespaces(ctx context.Context) ([]string, error)
	// Tokens is the table of API tokens, shared by all namespaces.
	Tokens() TokenStore
	// OnEnded registers fn, called after a COMMIT (by any writer of the
	// database the driver can hear) with the keys of ns whose reservation
	// that transaction ended. Calls are hints for waiting reserves: they
	// may be spurious, late or (after a lost connection) missing, and
	// fn must not block. Register before the first Write.
	OnEnded(fn func(ns string, keys []string))
	// OpenKeys counts the keys whose latest reservation has no outcome,
	// by namespace, state (StateReserved or StateInterrupted, on the
	// driver's clock) and idempotence; rows of no keys may be left out.
	// It is called on scrapes of /metrics (openkeys.go), so it must not
	// read every key record of a large ledger.
	OpenKeys(ctx context.Context) ([]OpenKeyCount, error)
	// DeletePruned deletes, in one transaction, the bodies of receipts
	// b.From … b.To of namespace ns (all pruned by prune b.Prune, From =
	// its DeletedThrough+1) and their derived rows, keeping their chain
	// hashes and upper tree hashes in kept tiles and b.KeyMACs, and moves
	// the prune's DeletedThrough to b.To (SPEC §16).
	DeletePruned(ctx context.Context, ns string, b DeleteBatch) error
	// Describe names the database for logs and errors (never a password).
	Describe() string
	Close() error
}

// Chain is one namespace: a chain of receipts, its key records, its
// Merkle tree and checkpoints, read without its head lock (writes go
// through Store.Write).
type Chain interface {
	ChainReader
	AuditReader
	PayloadReader
	// StateKey returns the namespace's secret: 32 random bytes made on
	// the first call and the same for every later one, from any writer of
	// the database (concurrent first calls agree). It is kept off the
	// chain and never enters a receipt; the MCP gateways derive the key
	// of their requestState envelopes from it (SPEC §11.1,
	// MCPStateKey). A read-only store returns ErrOpenedReadOnly while
	// none was made.
	StateKey(ctx context.Context) ([]byte, error)
}

// Tx is a batch's transaction in a Store.Write: what the decisions read
// (StateReader) and write (TxWriter). Reads see the writes made earlier in
// the same transaction.
type Tx interface {
	StateReader
	TxWriter
	PayloadTx
	ReconcileTx
}

// ReconcileTx keeps the token of each reservation a reconcile finalized
// (SPEC §15), so that the original call's late commit is appended even
// after the key was reserved again (its token is then not the latest).
type ReconcileTx interface {
	// PutReconciledToken records that the reservation at reserveSeq of key,
	// whose token hashes to tokenHash, was finalized by a reconcile.
	PutReconciledToken(ctx context.Context, key, tokenHash string, reserveSeq uint64) error
	// ReconciledReserve returns the seq of the reconciled reservation of
	// key whose token hashes to tokenHash, or 0.
	ReconciledReserve(ctx context.Context, key, tokenHash string) (uint64, error)
}

// Locked is what a batch's transaction holds when one of its operations
// starts.
type Locked struct {
	// Head is the chain's head, the batch's appends so far included.
	Head Head
	// Now is the time of this run, unix ms, the same for every operation
	// of the run, and never before the recorded_at of the chain's head:
	// a clock that steps back (across a restart too) is held at the last
	// recorded time, so recorded_at never decreases within a chain, and
	// leases and key lifetimes (which compare Now with recorded times)
	// are decided on that held time. Drivers shared by replicas use the
	// database's clock, so that leases do not depend on the clock of one
	// machine.
	Now uint64
	// PolicySeq is the seq of the chain's latest policy receipt, the
	// batch's appends included; 0 when the chain has none (SPEC §13).
	PolicySeq uint64
	// Pruned is the chain's pruned prefix (SPEC §16).
	Pruned PruneMark
}

// StateReader is what the decisions of SPEC §4 and the gate of SPEC §13
// read in a batch's transaction. A namespace without a policy reads none
// of the gate's part (KeyHistory, RecentOutcomes, MayHaveGateReceipts).
type StateReader interface {
	// Locked returns the head, the time and the policy in force; it must
	// cost no round trip of its own (it is read by every operation).
	Locked(ctx context.Context) (Locked, error)
	// Key returns the record of key, or found false.
	Key(ctx context.Context, key string) (k KeyRecord, found bool, err error)
	// Receipt returns the receipt at seq, which must exist.
	Receipt(ctx context.Context, seq uint64) (chain.Receipt, error)
	// MaxAttempt returns the highest attempt recorded for execution on key
	// in the receipts from seq since on (the key's current generation).
	MaxAttempt(ctx context.Context, key, execution string, since uint64) (max uint64, found bool, err error)
	// LastSeq returns the seq of key's latest receipt of any kind (replays
	// included); the key has one.
	LastSeq(ctx context.Context, key string) (uint64, error)
	// ReadHashes reads stored tree hashes, this transaction's included;
	// the hashes of pruned leaves are in KeptTiles instead.
	ReadHashes(ctx context.Context, idx []int64) ([]tlog.Hash, error)
	// KeptTiles reads the kept tiles of the pruned prefix (SPEC §16).
	KeptTiles(ctx context.Context, tiles []int64) ([]tlog.KeptTile, error)
	// KeyHistory returns key's receipts (every kind) with seq >= since,
	// in seq order.
	KeyHistory(ctx context.Context, key string, since uint64) ([]chain.Receipt, error)
	// RecentOutcomes calls fn, in seq order, for each commit and resolve
	// receipt whose tool and input_hash are these and whose recorded_at
	// is at least notBefore, until fn returns false.
	RecentOutcomes(ctx context.Context, tool, inputHash string, notBefore uint64, fn func(*chain.Receipt) bool) error
	// Openings returns the openings of the receipts at seqs that have
	// values kept (SPEC §14), this transaction's appends included.
	Openings(ctx context.Context, seqs []uint64) (map[uint64]*chain.Opening, error)
	// MayHaveGateReceipts reports whether key may have ask or deny
	// receipts: false only when it surely has none, which spares the gate
	// the key's history when no rule gates the request. A driver that
	// cannot tell cheaply says true.
	MayHaveGateReceipts(ctx context.Context, key string) (bool, error)
}

// TxWriter is what a batch writes.
type TxWriter interface {
	// Append stores r, already linked to the head, with the stored Merkle
	// hashes of leaf r.Seq-1 (sumdb.StoredHashes order, starting at index
	// sumdb.StoredHashIndex(0, r.Seq-1)), and the values of its committed
	// fields (r.Open, SPEC §14) beside it. The head becomes r. A driver
	// that keeps appended receipts keeps them without r.Open.
	Append(ctx context.Context, r *chain.Receipt, treeHashes []tlog.Hash) error
	// PutKey inserts or replaces a key record.
	PutKey(ctx context.Context, k *KeyRecord) error
	// PutCheckpoint stores a signed checkpoint, setting c.SignedAt to the
	// run's time; ErrStaleCheckpoint unless c is larger than every stored
	// one.
	PutCheckpoint(ctx context.Context, c *tlog.Signed) error
	// Probe makes a small real durable write outside the chain (the
	// readiness probe after a failed write).
	Probe(ctx context.Context) error
	// PutAskInput keeps the input of the ask at seq off the chain until
	// deleteAfter (unix ms), and deletes the inputs whose deleteAfter is
	// before now.
	PutAskInput(ctx context.Context, seq uint64, input string, deleteAfter, now uint64) error
	// SetAskInputDeadline moves the deletion of the ask's input (if still
	// kept) to deleteAfter, and deletes the inputs whose deleteAfter is
	// before now.
	SetAskInputDeadline(ctx context.Context, seq, deleteAfter, now uint64) error
	// PurgeAskInputs deletes the inputs whose deleteAfter is before now.
	PurgeAskInputs(ctx context.Context, now uint64) error
	// PutPrune records the prune receipt p.Seq, just appended (SPEC §16):
	// its row (DeletedThrough = p.From-1) and the bodies of the key
	// receipts in its range (p.Kept).
	PutPrune(ctx context.Context, p *Prune) error
}

// ChainReader is what the domain reads of one namespace without taking
// its head lock: keys and receipts (KeyReader) and the verifiable log
// (LogReader). The verifier's queries are a port of their own
// (AuditReader), which every Chain also is.
type ChainReader interface {
	KeyReader
	LogReader
	PruneReader
}

// AuditReader is a namespace read by the verifier (verify.DB) without its
// write lock: the chain in seq order, and the queries that bound a check's
// memory: receipts grouped by key, one receipt by seq, the key records and
// the audit's duplicate and repeated-failure groupings.
type AuditReader interface {
	// Receipts yields the receipts after seq in seq order; fn must not
	// retain the pointer it is given.
	Receipts(ctx context.Context, after uint64, fn func(*chain.Receipt) error) error
	// KeyReceipts yields every reserve, commit and resolve after a seq,
	// grouped by key in key byte order and in seq order within a key.
	KeyReceipts(ctx context.Context, after uint64, fn func(*chain.Receipt) error) error
	// Keys yields the key records in key byte order (ErrNoKeyTable: the
	// store keeps none).
	Keys(ctx context.Context, fn func(*KeyRecord) error) error
	// KeyDrift compares one key's record with its receipts in one
	// snapshot: the scan and the receipts are read in different
	// snapshots, so while a writer runs a key can look different in the
	// two, and the verifier re-checks such a key before it counts.
	KeyDrift(ctx context.Context, key string) ([]string, error)
	// DuplicateSuccesses lists, in constant memory, the successes of
	// distinct keys that share a tool and input, ordered by tool,
	// input_hash and seq.
	DuplicateSuccesses(ctx context.Context, fn func(*Success) error) error
	// RepeatedFailures lists the calls after a failure of tool ("": every
	// tool), grouped by (tool, input_hash).
	RepeatedFailures(ctx context.Context, tool string, fn func(*CallAfterFailure) error) error
	// GetReceipt reads the receipt at seq.
	GetReceipt(ctx context.Context, seq uint64) (*chain.Receipt, error)
	// ListReceipts lists receipts by filter (the verifier asks whether
	// any policy receipt exists).
	ListReceipts(ctx context.Context, f ReceiptFilter) ([]chain.Receipt, *uint64, error)
	// Head sizes a full run's key state table.
	Head(ctx context.Context) (Head, error)
	// KeyTTL is the key_ttl_ms stored with the namespace (SPEC §12).
	KeyTTL(ctx context.Context) (uint64, error)
}

// KeyReader reads a namespace's keys and receipts, for the API, and the
// asked inputs of SPEC §13.
type KeyReader interface {
	// Head reads the durable head; it can fail.
	Head(ctx context.Context) (Head, error)
	// KeyTTL is the namespace's key_ttl_ms, stored with its chain when
	// it was created (SPEC §12); 0: keys never expire.
	KeyTTL(ctx context.Context) (uint64, error)
	// GetKey returns a key's state and all its receipts; FirstSeq and
	// FinalSeq are its record's, ExpiresAt is left 0 (KeyView.WithLifetime).
	GetKey(ctx context.Context, key string) (*KeyView, error)
	GetReceipt(ctx context.Context, seq uint64) (*chain.Receipt, error)
	ListReceipts(ctx context.Context, f ReceiptFilter) ([]chain.Receipt, *uint64, error)
	// AskInput returns the input kept for the ask at seq (SPEC §13), or
	// found false once it is deleted or past its deleteAfter at now.
	AskInput(ctx context.Context, seq, now uint64) (input string, found bool, err error)
}

// LogReader reads a namespace's Merkle tree and signed checkpoints
// (SPEC §9).
type LogReader interface {
	// TreeSize is the number of leaves whose hashes are stored.
	TreeSize(ctx context.Context) (int64, error)
	// HashReader reads stored tree hashes; a missing one is an error.
	HashReader(ctx context.Context) sumdb.HashReader
	// ReceiptHashes returns the chain hashes of receipts from+1 … from+n.
	ReceiptHashes(ctx context.Context, from uint64, n int) ([]chain.Hash, error)
	LatestCheckpoint(ctx context.Context) (*tlog.Signed, error)
	CheckpointAt(ctx context.Context, n int64) (*tlog.Signed, error)
	CheckpointCovering(ctx context.Context, n int64) (*tlog.Signed, error)
	// FirstCheckpointCovering is the smallest stored checkpoint of size
	// at least n, nil if none: the first to prove receipt n included (a
	// key receipt under the key it retires, SPEC §9.2).
	FirstCheckpointCovering(ctx context.Context, n int64) (*tlog.Signed, error)
}

// KeyRecord is the derived state of one idempotency key, which the
// receipts determine (TokenHash aside): a row of PostgreSQL's keys table,
// a record of the SQLite driver's key index.
type KeyRecord struct {
	Key            string
	Generated      bool
	Tool           string // fingerprint, from the first reserve
	Effect         string
	InputHash      string
	Idempotent     bool
	FirstSeq       uint64 // the first reserve
	ReserveSeq     uint64 // the latest reserve
	LeaseExpiresAt uint64 // of the latest reserve, unix ms
	FinalSeq       uint64 // the latest commit or resolve; 0 if none
	// TokenHash is the SHA-256 of the latest reservation token, as bytes
	// in a string (comparable). It is not in the receipts: listings of
	// the key records (ChainReader.Keys) leave it empty.
	TokenHash string
}

// TokenRow is one stored API token: the secret only as its SHA-256.
type TokenRow struct {
	ID         string // the public part after the prefix
	Name       string
	Role       string
	Hash       []byte
	Namespaces []string // empty: every namespace
	CreatedAt  int64
	RevokedAt  int64 // 0 while valid
}

// TokenStore is the driver's table of API tokens.
type TokenStore interface {
	// InsertToken stores t, or returns ErrTokenExists for a taken name.
	InsertToken(ctx context.Context, t *TokenRow) error
	// ListTokens lists every token, revoked ones included, by name.
	ListTokens(ctx context.Context) ([]TokenRow, error)
	// RevokeToken marks name revoked at unix second at, or returns
	// ErrTokenUnknown.
	RevokeToken(ctx context.Context, name string, at int64) error
	// LookupToken returns the token with id, or nil.
	LookupToken(ctx context.Context, id string) (*TokenRow, error)
	// AnyValidToken reports whether an unrevoked token exists.
	AnyValidToken(ctx context.Context) (bool, error)
}

// Success is one successful outcome, as DuplicateSuccesses lists it.
type Success struct {
	Tool, InputHash, Key string
	Seq, RecordedAt      uint64
}

// CallAfterFailure is one row of RepeatedFailures: the first failure of a
// (tool, input_hash), or the first reserve of a key reserved after it.
type CallAfterFailure struct {
	Tool, InputHash string
	// Failure is true for the failure (a commit or resolve), false for a
	// later key's first reserve or a rerun.
	Failure bool
	// Rerun is true for a reserve of a key after its own not_applied
	// outcome (SPEC §4.1) by another execution: the same key can repeat a
	// call that applied nothing.
	Rerun       bool
	Key         string
	ExecutionID string
	ErrorCode   string // the failure's error code
	Seq         uint64
	RecordedAt  uint64
}
