// Package pgtest gives tests a PostgreSQL database of their own: a fresh
// database per test (CREATE DATABASE t_<random>, dropped when the test
// ends) in the cluster named by $LEDGER_TEST_POSTGRES, or else in a
// throwaway cluster that the test binary starts (initdb in a temporary
// directory, a Unix socket only, fsync off) and stops when it exits.
//
// A package whose tests use it calls Main from TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// Without a cluster (no PostgreSQL binaries, initdb failing) the tests are
// skipped with "postgres: no cluster: <reason>", except when $CI is set:
// then they fail, so that CI never skips them silently.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvURL names the environment variable holding the URL of an existing
// cluster to create test databases in, e.g.
// postgres://ledger@/postgres?host=/tmp/dir. Its role must be allowed to
// create databases.
const EnvURL = "LEDGER_TEST_POSTGRES"

var (
	sharedOnce    sync.Once
	shared        *Cluster
	sharedErr     error
	mainMu        sync.Mutex
	mainRunning   bool
	ownedClusters []*Cluster // stopped by Main
)

// Main runs the tests of m and then stops the clusters this binary
// started, and exits with the tests' status. Call it from TestMain.
func Main(m *testing.M) { os.Exit(Run(m)) }

// Run is Main without the exit, for a TestMain with its own cleanup: it
// returns the tests' status.
func Run(m *testing.M) int {
	mainMu.Lock()
	mainRunning = true
	mainMu.Unlock()
	code := m.Run()
	mainMu.Lock()
	cs := ownedClusters
	ownedClusters = nil
	mainMu.Unlock()
	for _, c := range cs {
		if err := c.destroy(); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
		}
	}
	return code
}

// noCluster skips t, or fails it when $CI is set.
func noCluster(t testing.TB, err error) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("postgres: no cluster: %v (CI is set: not skipping)", err)
	}
	t.Skipf("postgres: no cluster: %v", err)
}

// URL returns the URL of a new empty database for t, dropped when t ends.
func URL(t testing.TB) string {
	t.Helper()
	base := os.Getenv(EnvURL)
	if base == "" {
		sharedOnce.Do(func() { shared, sharedErr = startCluster() })
		if sharedErr != nil {
			noCluster(t, sharedErr)
		}
		base = shared.base
	}
	return createDatabase(t, base)
}

// Cluster is a PostgreSQL cluster that this test binary started in a
// temporary directory, listening on a Unix socket only.
type Cluster struct {
	bin  string   // directory of initdb, pg_ctl
	dir  string   // holds data/, the socket and log
	as   []string // runuser prefix when running as root
	base string   // URL of its postgres database
	mu   sync.Mutex
}

// StartCluster starts a cluster of t's own (for tests that stop and start
// it, which must not disturb other tests' databases); it is destroyed when
// t ends. It needs the PostgreSQL binaries even when $LEDGER_TEST_POSTGRES
// is set.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	c, err := startCluster()
	if err != nil {
		noCluster(t, err)
	}
	t.Cleanup(func() {
		if err := c.destroy(); err != nil {
			t.Errorf("pgtest: %v", err)
		}
	})
	return c
}

// URL returns the URL of a new empty database in c for t, dropped when t
// ends (if the cluster is running then).
func (c *Cluster) URL(t testing.TB) string {
	t.Helper()
	return createDatabase(t, c.base)
}

// Stop stops the cluster at once (pg_ctl stop -m immediate): clients see
// their connections drop, as when a database server crashes.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.run("pg_ctl", "-D", c.data(), "-m", "immediate", "-w", "stop")
}

// Start starts the cluster again after Stop.
func (c *Cluster) Start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.start()
}

// watch starts a watchdog process that stops the cluster and removes its
// directory once this test binary has exited, however it exits (a panic
// or a timeout skips Main's cleanup).
func (c *Cluster) watch() error {
	q := func(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
	stop := q(filepath.Join(c.bin, "pg_ctl")) + " -D " + q(c.data()) + " -m immediate -w stop"
	if len(c.as) > 0 {
		stop = "runuser -u nobody -- " + stop
	}
	script := fmt.Sprintf(`while kill -0 %d 2>/dev/null; do sleep 1; done; `+
		`if [ -e %s ]; then %s >/dev/null 2>&1; fi; rm -rf %s`,
		os.Getpid(), q(filepath.Join(c.data(), "postmaster.pid")), stop, q(c.dir))
	cmd := exec.Command("sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // out of the test's process group
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("cluster watchdog: %w", err)
	}
	go func() { _ = cmd.Wait() }()
	return nil
}

func (c *Cluster) data() string { return filepath.Join(c.dir, "data") }

func (c *Cluster) start() error {
	opts := "-c listen_addresses='' -k " + c.dir + " -c fsync=off -c full_page_writes=off" +
		" -c max_connections=300 -c shared_buffers=32MB"
	return c.run("pg_ctl", "-D", c.data(), "-l", filepath.Join(c.dir, "log"), "-w", "-t", "60", "-o", opts, "start")
}

func (c *Cluster) run(name string, args ...string) error {
	argv := append(append([]string{}, c.as...), append([]string{filepath.Join(c.bin, name)}, args...)...)
	cmd := exec.Command(argv[0], argv[1:]...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(c.dir, "log"))
		return fmt.Errorf("%s: %w: %s%s", name, err, strings.TrimSpace(string(out)), tail(string(log)))
	}
	return nil
}

func tail(s string) string {
	if s == "" {
		return ""
	}
	if len(s) > 2000 {
		s = s[len(s)-2000:]
	}
	return "\nserver log: " + s
}

// destroy stops the cluster (if running) and removes its directory.
func (c *Cluster) destroy() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var err error
	if _, serr := os.Stat(filepath.Join(c.data(), "postmaster.pid")); serr == nil {
		err = c.run("pg_ctl", "-D", c.data(), "-m", "immediate", "-w", "stop")
	}
	if rerr := os.RemoveAll(c.dir); rerr != nil && err == nil {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("destroy cluster %s: %w", c.dir, err)
	}
	return nil
}

// binDir finds the PostgreSQL server binaries: pg_config --bindir, else
// the newest /usr/lib/postgresql/*/bin.
func binDir() (string, error) {
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	var found []string
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			found = append(found, d)
		}
	}
	if len(found) == 0 {
		return "", errors.New("no initdb (pg_config --bindir, /usr/lib/postgresql/*/bin); install postgresql")
	}
	version := func(d string) int {
		n, _ := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		return n
	}
	sort.Slice(found, func(i, j int) bool { return version(found[i]) < version(found[j]) })
	return found[len(found)-1], nil
}

// startCluster initialises and starts a cluster in a new directory under
// /tmp (a short path: a socket path has at most 107 bytes, and the
// unprivileged user must reach it). As root, initdb and the server run as
// nobody, because initdb refuses root.
func startCluster() (*Cluster, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("/tmp", "ledger-pg-")
	if err != nil {
		return nil, fmt.Errorf("cluster directory: %w", err)
	}
	c := &Cluster{bin: bin, dir: dir}
	fail := func(err error) (*Cluster, error) {
		_ = c.destroy()
		return nil, err
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("nobody")
		if err != nil {
			return fail(fmt.Errorf("running as root and no user nobody to run PostgreSQL as: %w", err))
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			return fail(fmt.Errorf("cluster directory: %w", err))
		}
		c.as = []string{"runuser", "-u", "nobody", "--"}
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fail(fmt.Errorf("cluster directory: %w", err))
	}
	if err := c.run("initdb", "-D", c.data(), "-U", "ledger", "-A", "trust", "-E", "UTF8",
		"--locale=C", "--no-sync"); err != nil {
		return fail(err)
	}
	if err := c.start(); err != nil {
		return fail(err)
	}
	if err := c.watch(); err != nil {
		return fail(err)
	}
	c.base = "postgres://ledger@/postgres?host=" + url.QueryEscape(dir)
	mainMu.Lock()
	defer mainMu.Unlock()
	if !mainRunning {
		// Nobody would stop it: refuse rather than leak a server.
		_ = c.run("pg_ctl", "-D", c.data(), "-m", "immediate", "-w", "stop")
		_ = os.RemoveAll(dir)
		return nil, errors.New("pgtest.Main is not called from TestMain, so the cluster could not be stopped")
	}
	ownedClusters = append(ownedClusters, c)
	return c, nil
}

// createDatabase creates t_<random> in the cluster of base and returns
// its URL; the database is dropped when t ends.
func createDatabase(t testing.TB, base string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		noCluster(t, fmt.Errorf("connect: %w", err))
	}
	defer func() { _ = conn.Close(context.Background()) }()
	var b [8]byte
	_, _ = rand.Read(b[:])
	name := "t_" + hex.EncodeToString(b[:])
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("pgtest: create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			return // the cluster is gone (stopped by the test, or destroyed)
		}
		defer func() { _ = conn.Close(context.Background()) }()
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("pgtest: %s: %v", EnvURL, err)
	}
	u.Path = "/" + name
	return u.String()
}
