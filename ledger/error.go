package ledger

import (
	"errors"
	"fmt"
	"time"
)

// Error codes of the contract (SPEC §4). The api package maps each to an
// HTTP status in one table.
const (
	// Generic request errors.
	ECodeInvalidJSON      = "invalid_json"
	ECodeInvalidRequest   = "invalid_request"
	ECodeInvalidKey       = "invalid_key"
	ECodeBodyTooLarge     = "body_too_large"
	ECodeUnsupportedMedia = "unsupported_media_type"
	ECodeNotFound         = "not_found"
	ECodeMethodNotAllowed = "method_not_allowed"
	ECodeUnavailable      = "unavailable"
	ECodeUnauthorized     = "unauthorized"
	ECodeForbidden        = "forbidden"
	ECodeRateLimited      = "rate_limited"
	ECodeInternal         = "internal"
	// ECodeIntegrityError: a stored receipt whose value was about to be
	// served does not match the hash the chain recorded for it (500; the
	// value is never served).
	ECodeIntegrityError = "integrity_error"
	// ECodeStorageCorrupt: the database reports a corrupt page or file
	// (503, ErrStorageCorrupt).
	ECodeStorageCorrupt = "storage_corrupt"

	// Reserve.
	ECodeFingerprintMismatch = "fingerprint_mismatch"
	ECodeInProgress          = "in_progress"
	ECodeUnsafeResume        = "unsafe_resume"
	ECodeRetryNotAllowed     = "retry_not_allowed"
	ECodeAttemptConflict     = "attempt_conflict"

	// Commit and resolve.
	ECodeUnknownKey       = "unknown_key"
	ECodeStaleReservation = "stale_reservation"
	ECodeAlreadyFinalized = "already_finalized"
	ECodeNotInterrupted   = "not_interrupted"
	ECodeUnknownReceipt   = "unknown_receipt"

	// Verifiable log (SPEC §9).
	ECodeNotCheckpointed = "not_checkpointed"
	// ECodeKeyRotationConflict: a second key receipt retiring the same
	// signing key, or announcing a key announced before (SPEC §9.2); 409.
	ECodeKeyRotationConflict = "key_rotation_conflict"

	// Bounded disk (SPEC §16). ECodeNotPrunable: nothing up to the seq
	// asked may be pruned yet (details name the pinning key and its
	// state), or the namespace has no key TTL; 409.
	ECodeNotPrunable = "not_prunable"
	// ECodePruned: the receipt or key asked for was pruned; its body is
	// in an archived segment (details: the prune receipt and the
	// segment's name); 410.
	ECodePruned = "pruned"

	// Namespaces (SPEC §7).
	ECodeUnknownNamespace = "unknown_namespace"
	ECodeNamespaceExists  = "namespace_exists"
	// ECodeNamespaceLimit: creating one more namespace would pass the
	// server's limit (ledgerd --max-namespaces); 507.
	ECodeNamespaceLimit = "namespace_limit"

	// Approvals and the gate's policy (SPEC §13).
	ECodeApprovalRequired    = "approval_required" // not an error: the 202 status
	ECodeDeniedByPolicy      = "denied_by_policy"
	ECodeApprovalRejected    = "approval_rejected"
	ECodeUnchangedRetry      = "unchanged_retry"
	ECodeKeyRequired         = "key_required"
	ECodeEffectClassMismatch = "effect_class_mismatch"
	ECodeAlreadyAnswered     = "already_answered"
	ECodeApprovalExpired     = "approval_expired"
	ECodeSelfApproval        = "self_approval"
	ECodeUnknownApproval     = "unknown_approval"

	// Reconciling an unknown outcome (SPEC §15).
	ECodeReconcileNotAllowed = "reconcile_not_allowed"
	ECodeReconcileTooEarly   = "reconcile_too_early"

	// Erasure (SPEC §14).
	ECodePayloadsInline = "payloads_inline"
	ECodeUnknownErasure = "unknown_erasure"
)

// Error is a domain error: a contract error code, a human message and
// optional details. Any error that is not an *Error (or does not wrap one)
// is internal and is shown to clients only generically.
type Error struct {
	Code    string
	Message string
	Details map[string]any
	// RetryAfter, when positive, tells the client when to try again.
	RetryAfter time.Duration
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s", e.Code, e.Message) }

// Errorf returns an *Error with the given code and a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Invalid returns an invalid_request error naming the offending field
// (Details["field"]); format and args make the message.
func Invalid(field, format string, args ...any) *Error {
	return &Error{Code: ECodeInvalidRequest, Message: fmt.Sprintf(format, args...),
		Details: map[string]any{"field": field}}
}

// ErrorCode returns the code of err's *Error, ECodeUnavailable for
// ErrUnavailable, and ECodeInternal for anything else.
func ErrorCode(err error) string {
	var e *Error
	var ie *IntegrityError
	switch {
	case err == nil:
		return ""
	case errors.As(err, &e):
		return e.Code
	case errors.As(err, &ie):
		return ECodeIntegrityError
	case errors.Is(err, ErrStorageCorrupt):
		return ECodeStorageCorrupt
	case errors.Is(err, ErrUnavailable):
		return ECodeUnavailable
	default:
		return ECodeInternal
	}
}

// ErrorMessage returns the message of err's *Error, a fixed text for
// ErrUnavailable and "internal error" for anything else, so that internals
// never reach a client.
func ErrorMessage(err error) string {
	var e *Error
	switch {
	case err == nil:
		return ""
	case errors.As(err, &e):
		return e.Message
	case errors.As(err, new(*IntegrityError)):
		return "a stored receipt does not match the hash the chain recorded for it, so its value is not served; `ledgerctl verify` shows what changed"
	case errors.Is(err, ErrStorageCorrupt):
		return "the ledger database is corrupt; nothing was recorded, and an operator must restore it (ledgerctl verify shows what is readable)"
	case errors.Is(err, ErrBusy):
		return "the ledger database is busy; retry shortly"
	case errors.Is(err, ErrOverloaded):
		return "too many requests in flight; retry shortly"
	case errors.Is(err, ErrUnavailable):
		return "the ledger database cannot be written right now; retry later"
	default:
		return "internal error"
	}
}

// Sentinel errors. ErrBusy and ErrReadOnly, ErrDiskFull and ErrClosed all
// wrap ErrUnavailable: the write was not recorded and may be retried.
var (
	ErrUnavailable = errors.New("ledger unavailable")
	ErrBusy        = fmt.Errorf("database busy: %w", ErrUnavailable)
	ErrReadOnly    = fmt.Errorf("database is read-only: %w", ErrUnavailable)
	ErrDiskFull    = fmt.Errorf("disk full: %w", ErrUnavailable)
	ErrIO          = fmt.Errorf("disk I/O error: %w", ErrUnavailable)
	ErrClosed      = fmt.Errorf("ledger closed: %w", ErrUnavailable)
	// ErrOverloaded means the server has too many requests in flight.
	ErrOverloaded = fmt.Errorf("too many requests in flight: %w", ErrUnavailable)
	// ErrStorageCorrupt means the database reported a corrupt page or a
	// file that is not a database (SQLite's SQLITE_CORRUPT, SQLITE_NOTADB).
	// Nothing was recorded, but retrying does not help: the ledger stops
	// reporting ready (Ledger.Fault) until an operator restores the file.
	ErrStorageCorrupt = fmt.Errorf("database corrupt: %w", ErrUnavailable)

	// ErrSchemaVersion means the database file has a schema this build
	// does not know.
	ErrSchemaVersion = errors.New("unsupported schema version")
	// ErrNotLedger means the database (a SQLite file, a PostgreSQL
	// database) belongs to something else.
	ErrNotLedger = errors.New("not an effect-ledger database")
	// ErrDerivedState means the derived state (the recorded head of a
	// SQLite file) does not match the receipts: serving from it could
	// replay another key's result. `ledgerctl rebuild-index` repairs it.
	ErrDerivedState = errors.New("the derived state does not match the chain")
	// ErrNoKeyTable is what ChainReader.Keys returns when the reader has
	// no derived key records to list (a SQLite file read without its key
	// index, which only ledgerd opens): the verifier then replays the
	// keys without cross-checking a stored state.
	ErrNoKeyTable = errors.New("no derived key records to list")
)

// ErrNamespaceLost means a namespace the ledger's registry knows has no
// storage, or storage behind the head the registry recorded for it (a
// restore of the ledger file without its namespace files, a namespace file
// from an older backup). Serving it would run committed effects again, so
// the ledger refuses; the error names the recovery. It wraps
// ErrUnavailable: a request meeting it is not recorded.
var ErrNamespaceLost = fmt.Errorf("%w: a registered namespace's file is missing or behind the registry", ErrUnavailable)
