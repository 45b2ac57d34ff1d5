package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// adminTokenName names the admin token ledger-mcp makes for its
// --admin-listen; a taken name gets a number (ledger-mcp-admin-2, …).
const adminTokenName = "ledger-mcp-admin"

// maxTokenFile bounds what is read of a token file.
const maxTokenFile = 4 << 10

// serveAdmin serves the embedded ledger's REST API and web page on
// AdminListen until Close. Every route but the health probes, the
// page's static files and the API's description needs a token, always:
// the admin token adminToken keeps (or another token of the ledger, by
// its role), never none, since anyone on the machine (a coding agent
// with a shell among them) reaches a loopback address. It returns the
// base URL.
func (m *Main) serveAdmin(ctx context.Context) (url string, err error) {
	path, token, created, err := m.adminToken(ctx)
	if err != nil {
		return "", err
	}
	ln, err := net.Listen("tcp", m.AdminListen)
	if err != nil {
		return "", fmt.Errorf("--admin-listen: %w", err)
	}
	handler := api.NewServer(m.ledger, api.Config{Logger: m.Logger})
	handler.RequireAuth()
	if _, err := handler.AuthEnabled(ctx); err != nil {
		_ = ln.Close()
		return "", fmt.Errorf("--admin-listen: %w", err)
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(api.WrapListener(ln)) }()
	m.closers = append(m.closers, srv.Close)
	url = "http://" + ln.Addr().String()
	if created {
		// Shown once, for the person who started the gateway; the log
		// names the file only.
		fmt.Fprintf(m.stderr, "ledger-mcp: the admin token of %s (for its page and ledgerctl --server; shown only now, kept in %s, mode 0600):\n%s\n",
			url, path, token)
	}
	m.Logger.Info("admin API ready", "addr", ln.Addr().String(), "url", url, "auth", true, "admin_token_file", path)
	return url, nil
}

// adminTokenPath is where the admin token is kept: --admin-token-file,
// else <db>.admin-token beside a SQLite --db.
func (m *Main) adminTokenPath() (string, error) {
	if m.AdminTokenFile != "" {
		return m.AdminTokenFile, nil
	}
	if m.dbFile == "" {
		return "", errors.New("--admin-listen with a PostgreSQL --db needs --admin-token-file FILE: " +
			"the file that keeps the admin token of the listener (created, mode 0600, on first start)")
	}
	path, err := filepath.Abs(m.dbFile + ".admin-token")
	if err != nil {
		return "", fmt.Errorf("--admin-token-file: %w", err)
	}
	return path, nil
}

// adminToken returns the admin token of the --admin-listen and the file
// that keeps it: the file's token when it exists (it must be a valid
// admin token of this ledger for its namespace, in a file no other user
// may read), else a new admin token, written to the file (created is
// true: the caller shows it once).
func (m *Main) adminToken(ctx context.Context) (path, token string, created bool, err error) {
	if path, err = m.adminTokenPath(); err != nil {
		return "", "", false, err
	}
	for range 2 {
		token, err = readTokenFile(path)
		if err == nil {
			return path, token, false, m.checkAdminToken(ctx, path, token)
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", "", false, err
		}
		token, err = m.createAdminToken(ctx, path)
		if err == nil {
			return path, token, true, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return "", "", false, err
		}
		// Another gateway wrote the file first: use its token.
	}
	return "", "", false, fmt.Errorf("--admin-token-file %s: cannot be read after creating it", path)
}

// checkAdminToken checks that the token read from path is an admin token
// of this ledger that may use the gateway's namespace.
func (m *Main) checkAdminToken(ctx context.Context, path, token string) error {
	p, err := m.ledger.Authenticate(ctx, token)
	if errors.Is(err, ledger.ErrBadToken) {
		return fmt.Errorf("--admin-token-file %s: its token is not a valid token of this ledger (revoked, or made for another "+
			"ledger): delete the file to have a new admin token made at start, or write an admin token of this ledger into it", path)
	}
	if err != nil {
		return fmt.Errorf("--admin-token-file %s: %w", path, err)
	}
	if p.Role != ledger.RoleAdmin {
		return fmt.Errorf("--admin-token-file %s: its token %q has the role %s: the admin listener needs an admin token", path, p.Name, p.Role)
	}
	if !p.AllowsNamespace(m.Namespace) {
		return fmt.Errorf("--admin-token-file %s: its token %q may not use namespace %s", path, p.Name, m.Namespace)
	}
	return nil
}

// createAdminToken makes an admin token in the ledger and writes it to
// path, which must not exist (else an error wrapping fs.ErrExist, and the
// new token is revoked).
func (m *Main) createAdminToken(ctx context.Context, path string) (string, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", fmt.Errorf("--admin-token-file: %w", err)
	}
	tokens := ledger.NewTokens(m.ledger.Store().Tokens())
	var name, token string
	var err error
	for i := 1; i <= 1000; i++ {
		name = adminTokenName
		if i > 1 {
			name = fmt.Sprintf("%s-%d", adminTokenName, i)
		}
		token, err = tokens.Create(ctx, name, ledger.RoleAdmin)
		if !errors.Is(err, ledger.ErrTokenExists) {
			break
		}
	}
	if err != nil {
		return "", fmt.Errorf("--admin-listen: create the admin token: %w", err)
	}
	if err := writeNewFile(path, []byte(token+"\n")); err != nil {
		if rerr := tokens.Revoke(context.WithoutCancel(ctx), name); rerr != nil {
			m.Logger.Warn("cannot revoke the admin token whose file was not written", "token", name, "err", rerr)
		}
		return "", err
	}
	m.Logger.Info("admin token created", "token", name, "admin_token_file", path)
	return token, nil
}

// writeNewFile writes b to path, mode 0600, durably, unless path exists
// (an error wrapping fs.ErrExist).
func writeNewFile(path string, b []byte) error {
	tmp := fmt.Sprintf("%s.%s.tmp", path, rand.Text())
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("--admin-token-file: %w", err)
	}
	defer func() { _ = os.Remove(tmp) }()
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("--admin-token-file: %w", err)
	}
	// A link fails if another gateway created the file first.
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return err
		}
		return fmt.Errorf("--admin-token-file: %w", err)
	}
	return nil
}

// readTokenFile reads the token a file keeps: a regular file no other
// user may read or write (as ssh keeps a private key), holding one token.
func readTokenFile(path string) (string, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	if err != nil {
		return "", fmt.Errorf("--admin-token-file: cannot read it: %w", err)
	}
	defer func() { _ = f.Close() }()
	st, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("--admin-token-file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("--admin-token-file %s: not a regular file", path)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return "", fmt.Errorf("--admin-token-file %s: other users may read or write it (mode %04o): it keeps an admin token; chmod 600 %s", path, perm, path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxTokenFile+1))
	if err != nil {
		return "", fmt.Errorf("--admin-token-file %s: %w", path, err)
	}
	token := strings.TrimSpace(string(b))
	if len(b) > maxTokenFile || token == "" || strings.ContainsAny(token, " \t\r\n") {
		return "", fmt.Errorf("--admin-token-file %s: does not hold one token (elt_…)", path)
	}
	return token, nil
}
