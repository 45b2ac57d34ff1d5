package storage

import (
	"context"
	"errors"
	"fmt"
	iofs "io/fs"
	"net/url"
	"os"
	"strings"
	"syscall"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
)

// What ledgerctl does to a database beside (or without) a running
// ledgerd, for either driver: tokens, namespaces, and naming the
// database in messages without its password.

// Errors of CheckFile and of Open of a SQLite path that holds no ledger.
var (
	// ErrNoDatabase: a SQLite path where no ledger file exists.
	ErrNoDatabase = errors.New("no ledger database")
	// ErrNoFiles: an operation on a ledger's files (backup, rebuild-index,
	// forget) asked of a PostgreSQL database, which has none.
	ErrNoFiles = errors.New("a PostgreSQL database has no ledger files")
)

// CheckFile says clearly when dsn names no SQLite ledger file: an error
// wrapping ErrNoDatabase, or one naming a directory or an unreadable
// path; ErrNoFiles for a PostgreSQL URL. It never creates anything.
func CheckFile(dsn string) error {
	if IsPostgres(dsn) {
		return ErrNoFiles
	}
	fi, err := os.Stat(dsn)
	switch {
	case errors.Is(err, iofs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("%w at %s", ErrNoDatabase, dsn)
	case err != nil:
		return fmt.Errorf("--db %s: %w", dsn, err)
	case fi.IsDir():
		return fmt.Errorf("--db %s is a directory, not a ledger database file", dsn)
	}
	return nil
}

// OpenTokens opens the API tokens of the database dsn, which must exist.
// On SQLite only the tokens table is written, so it may run beside
// ledgerd; on PostgreSQL the store is opened for writing. Close on the
// result releases what it opened.
func OpenTokens(ctx context.Context, dsn string, opts Options) (*ledger.Tokens, error) {
	if !IsPostgres(dsn) {
		if err := CheckFile(dsn); err != nil {
			return nil, err
		}
		return sqlite.OpenTokens(ctx, dsn)
	}
	opts.ReadOnly = false
	st, _, err := openPostgres(ctx, dsn, opts)
	if err != nil {
		return nil, RedactError(dsn, fmt.Errorf("open %s: %w", Describe(dsn), err))
	}
	return ledger.NewTokensCloser(st.Tokens(), st), nil
}

// CreateNamespace creates namespace name with settings st (a payload
// mode "" is ledger.DefaultPayloads), in the database dsn, which must exist;
// ledger.ErrNamespaceExists if it does. On SQLite it only adds the
// namespace's file and registry row, so it may run beside ledgerd.
func CreateNamespace(ctx context.Context, dsn, name string, st ledger.NamespaceSettings, opts Options) error {
	if !IsPostgres(dsn) {
		if err := CheckFile(dsn); err != nil {
			return err
		}
		return sqlite.CreateNamespace(ctx, dsn, name, st.Resolved())
	}
	opts.ReadOnly = false
	s, _, err := openPostgres(ctx, dsn, opts)
	if err != nil {
		return RedactError(dsn, fmt.Errorf("open %s: %w", Describe(dsn), err))
	}
	return errors.Join(s.CreateNamespace(ctx, name, st.Resolved()), s.Close())
}

// NamespaceFile returns the file that holds namespace ns of the SQLite
// ledger dsn (the ledger file holds every namespace), or false for a
// PostgreSQL database.
func NamespaceFile(dsn, ns string) (string, bool) {
	if IsPostgres(dsn) {
		return "", false
	}
	return dsn, true
}

// Describe names dsn for messages: a URL without its password, or the
// path.
func Describe(dsn string) string {
	if !IsPostgres(dsn) {
		return dsn
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return "the PostgreSQL URL given (not a valid URL)"
	}
	return u.Redacted()
}

// RedactError keeps the password of a PostgreSQL URL dsn out of err's
// text (a driver may quote the URL it was given); errors.Is and
// errors.As still see err.
func RedactError(dsn string, err error) error {
	if err == nil || !IsPostgres(dsn) {
		return err
	}
	u, perr := url.Parse(dsn)
	if perr != nil {
		// Unparseable: the whole value may hold a secret.
		return &redactedError{err: err, secrets: []string{dsn}}
	}
	var secrets []string
	if u.User != nil {
		if pw, ok := u.User.Password(); ok && pw != "" {
			secrets = append(secrets, pw, url.QueryEscape(pw), url.PathEscape(pw))
		}
	}
	if pw := u.Query().Get("password"); pw != "" {
		secrets = append(secrets, pw, url.QueryEscape(pw))
	}
	if len(secrets) == 0 {
		return err
	}
	return &redactedError{err: err, secrets: secrets}
}

// redactedError is an error whose text has secrets masked.
type redactedError struct {
	err     error
	secrets []string
}

func (e *redactedError) Error() string {
	msg := e.err.Error()
	for _, s := range e.secrets {
		msg = strings.ReplaceAll(msg, s, "xxxxx")
	}
	return msg
}

// Unwrap returns the error underneath.
func (e *redactedError) Unwrap() error { return e.err }
