package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// SQLSTATE codes the driver branches on.
const (
	codeSerialization    = "40001"
	codeDeadlock         = "40P01"
	codeUniqueViolation  = "23505"
	codeCheckViolation   = "23514"
	codeAdminShutdown    = "57P01"
	codeCrashShutdown    = "57P02"
	codeCannotConnect    = "57P03"
	codeReadOnlyTx       = "25006"
	codeInsufficientPriv = "42501"
	codeDiskFull         = "53100"
	codeOutOfMemory      = "53200"
	codeTooManyConns     = "53300"
	codeIOError          = "58030"
	codeDataCorrupted    = "XX001"
	codeIndexCorrupted   = "XX002"
	codeUndefinedTable   = "42P01"
)

// payloadTable wraps an error of a query of the payload or erasure tables
// that do not exist with ledger.ErrNoPayloadTable.
func payloadTable(err error) error {
	if isCode(err, codeUndefinedTable) {
		return fmt.Errorf("%w: %w", ledger.ErrNoPayloadTable, err)
	}
	return err
}

func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

func isCode(err error, code string) bool { return err != nil && pgCode(err) == code }

// isConnErr reports whether err is a failure to reach the server or a
// connection lost (rather than the server refusing a statement).
func isConnErr(err error) bool {
	if err == nil {
		return false
	}
	if code := pgCode(err); code != "" {
		return strings.HasPrefix(code, "08") || code == codeAdminShutdown ||
			code == codeCrashShutdown || code == codeCannotConnect || code == codeTooManyConns
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	return pgconn.SafeToRetry(err) || pgconn.Timeout(err) || errors.As(err, &ce) || errors.As(err, &ne) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, pgconn.ErrConnClosed)
}

// retryable reports whether a Write run that failed with err (before
// COMMIT was sent) may simply run again.
func retryable(err error) bool {
	switch pgCode(err) {
	case codeSerialization, codeDeadlock:
		return true
	}
	return isConnErr(err)
}

// classify maps err to the ledger's sentinels where a caller must branch:
// the server unreachable or refusing writes wraps ledger.ErrUnavailable
// (503 + Retry-After), data or an index it reports corrupt
// ledger.ErrStorageCorrupt. The original error stays in the chain.
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded), errors.Is(err, ledger.ErrUnavailable):
		return err
	case errors.Is(err, puddle.ErrClosedPool):
		return fmt.Errorf("%w: %w", ledger.ErrClosed, err)
	}
	switch code := pgCode(err); {
	case code == codeSerialization, code == codeDeadlock:
		return fmt.Errorf("%w: %w", ledger.ErrBusy, err)
	case code == codeReadOnlyTx, code == codeInsufficientPriv:
		// A standby, or a role that may read but not write: nothing was
		// recorded, and writes may work once the operator fixes it.
		return fmt.Errorf("%w: %w", ledger.ErrReadOnly, err)
	case code == codeDiskFull:
		return fmt.Errorf("%w: %w", ledger.ErrDiskFull, err)
	case code == codeIOError, code == codeOutOfMemory:
		return fmt.Errorf("%w: %w", ledger.ErrIO, err)
	case code == codeDataCorrupted, code == codeIndexCorrupted:
		return fmt.Errorf("%w: %w", ledger.ErrStorageCorrupt, err)
	case isConnErr(err):
		return fmt.Errorf("%w: %w", ledger.ErrUnavailable, err)
	}
	return err
}
