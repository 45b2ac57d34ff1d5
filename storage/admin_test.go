package storage_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage"
	"github.com/effect-ledger/effect-ledger/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// newSQLite creates an empty SQLite ledger and returns its path.
func newSQLite(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ledger.db")
	st, _, err := storage.Open(context.Background(), path, storage.Options{})
	require.NoError(t, err)
	require.NoError(t, st.Close())
	return path
}

func TestCheckFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := newSQLite(t)
	assert.NoError(t, storage.CheckFile(path))
	err := storage.CheckFile(filepath.Join(dir, "missing.db"))
	assert.ErrorIs(t, err, storage.ErrNoDatabase)
	assert.ErrorContains(t, err, "missing.db")
	assert.ErrorContains(t, storage.CheckFile(dir), "is a directory")
	assert.ErrorIs(t, storage.CheckFile("postgres://u@h/db"), storage.ErrNoFiles)
	assert.ErrorIs(t, storage.CheckFile("postgresql://u@h/db"), storage.ErrNoFiles)
	_, err = os.Stat(filepath.Join(dir, "missing.db"))
	assert.ErrorIs(t, err, os.ErrNotExist, "CheckFile creates nothing")
}

func TestDescribe_RedactError(t *testing.T) {
	t.Parallel()
	dsn := "postgres://auditor:s3cr%2Ft@db.example:5432/ledger?password=other"
	assert.Equal(t, "/var/lib/ledger.db", storage.Describe("/var/lib/ledger.db"))
	assert.NotContains(t, storage.Describe(dsn), "s3cr")
	assert.Contains(t, storage.Describe(dsn), "auditor:xxxxx@db.example")

	base := errors.New("dial " + dsn + ": refused (s3cr/t, other)")
	err := storage.RedactError(dsn, base)
	assert.ErrorIs(t, err, base, "the error underneath stays reachable")
	for _, secret := range []string{"s3cr%2Ft", "s3cr/t", "other"} {
		assert.NotContains(t, err.Error(), secret)
	}
	assert.Same(t, base, storage.RedactError("ledger.db", base), "a file path has no secret")
	assert.Nil(t, storage.RedactError(dsn, nil))
}

func TestOpenTokens_SQLite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := newSQLite(t)
	toks, err := storage.OpenTokens(ctx, path, storage.Options{})
	require.NoError(t, err)
	_, err = toks.Create(ctx, "ci", "writer")
	require.NoError(t, err)
	require.NoError(t, toks.Close())

	toks, err = storage.OpenTokens(ctx, path, storage.Options{})
	require.NoError(t, err)
	list, err := toks.List(ctx)
	require.NoError(t, err)
	require.NoError(t, toks.Close())
	require.Len(t, list, 1)
	assert.Equal(t, "ci", list[0].Name)

	_, err = storage.OpenTokens(ctx, filepath.Join(t.TempDir(), "none.db"), storage.Options{})
	assert.ErrorIs(t, err, storage.ErrNoDatabase)
}

func TestCreateNamespace_SQLite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := newSQLite(t)
	require.NoError(t, storage.CreateNamespace(ctx, path, "payments", ledger.NamespaceSettings{KeyTTL: 60_000}, storage.Options{}))
	err := storage.CreateNamespace(ctx, path, "payments", ledger.NamespaceSettings{}, storage.Options{})
	assert.ErrorIs(t, err, ledger.ErrNamespaceExists)

	file, ok := storage.NamespaceFile(path, "payments")
	require.True(t, ok)
	assert.Equal(t, path, file, "the ledger file holds every namespace")
	assert.NoDirExists(t, path+".ns")
	assertNamespace(t, path, "payments", 60_000)

	err = storage.CreateNamespace(ctx, filepath.Join(t.TempDir(), "none.db"), "x", ledger.NamespaceSettings{}, storage.Options{})
	assert.ErrorIs(t, err, storage.ErrNoDatabase)
}

func TestOpenTokens_CreateNamespace_Postgres(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.URL(t)
	st, _, err := storage.Open(ctx, dsn, storage.Options{})
	require.NoError(t, err)
	require.NoError(t, st.Close())

	_, ok := storage.NamespaceFile(dsn, "payments")
	assert.False(t, ok, "PostgreSQL keeps every namespace in one database")
	require.NoError(t, storage.CreateNamespace(ctx, dsn, "payments", ledger.NamespaceSettings{KeyTTL: 60_000}, storage.Options{}))
	err = storage.CreateNamespace(ctx, dsn, "payments", ledger.NamespaceSettings{}, storage.Options{})
	assert.ErrorIs(t, err, ledger.ErrNamespaceExists)
	assertNamespace(t, dsn, "payments", 60_000)

	toks, err := storage.OpenTokens(ctx, dsn, storage.Options{})
	require.NoError(t, err)
	_, err = toks.Create(ctx, "ci", "reader", "payments")
	require.NoError(t, err)
	list, err := toks.List(ctx)
	require.NoError(t, err)
	require.NoError(t, toks.Close())
	require.Len(t, list, 1)
	assert.Equal(t, []string{"payments"}, list[0].Namespaces)
}

func TestOpenTokens_Postgres_unreachable(t *testing.T) {
	t.Parallel()
	dsn := "postgres://auditor:hunter2@127.0.0.1:1/ledger?connect_timeout=1"
	_, err := storage.OpenTokens(context.Background(), dsn, storage.Options{})
	require.Error(t, err)
	assert.False(t, strings.Contains(err.Error(), "hunter2"), err.Error())
}

// assertNamespace checks that dsn holds namespace ns with key_ttl_ms ttl.
func assertNamespace(t *testing.T, dsn, ns string, ttl uint64) {
	t.Helper()
	ctx := context.Background()
	st, _, err := storage.Open(ctx, dsn, storage.Options{ReadOnly: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, st.Close()) }()
	c, err := st.Chain(ctx, ns)
	require.NoError(t, err)
	got, err := c.KeyTTL(ctx)
	require.NoError(t, err)
	assert.Equal(t, ttl, got)
}
