package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// The storage matrix of issue 9: the same client, in one run, against
// ledgerd on SQLite and on PostgreSQL with one and two replicas, with 1
// and 16 namespaces, and the idempotency tables users build by hand on the
// same PostgreSQL (pgbench, no HTTP). The cluster runs with the server's
// defaults for durability: fsync and synchronous_commit on.

// pgCluster is a throwaway PostgreSQL cluster on a Unix socket.
type pgCluster struct {
	bin, dir string
	as       []string // runuser prefix when root
}

func startPG(dir string) (*pgCluster, error) {
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	if len(bins) == 0 {
		return nil, errors.New("no PostgreSQL binaries in /usr/lib/postgresql/*/bin (apt-get install postgresql)")
	}
	sort.Strings(bins)
	c := &pgCluster{bin: bins[len(bins)-1], dir: filepath.Join(dir, "pg")}
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return nil, err
	}
	if os.Geteuid() == 0 {
		// initdb refuses to run as root.
		if err := exec.Command("chown", "-R", "nobody:nogroup", c.dir).Run(); err != nil {
			return nil, fmt.Errorf("chown: %w", err)
		}
		_ = os.Chmod(dir, 0o755)
		c.as = []string{"runuser", "-u", "nobody", "--"}
	}
	if out, err := c.run("initdb", "-D", c.data(), "-U", "ledger", "-A", "trust", "-E", "UTF8"); err != nil {
		return nil, fmt.Errorf("initdb: %w: %s", err, out)
	}
	opts := fmt.Sprintf("-c listen_addresses='' -k %s -c max_connections=400 -c shared_buffers=256MB", c.dir)
	if out, err := c.run("pg_ctl", "-D", c.data(), "-l", filepath.Join(c.dir, "log"), "-w", "-o", opts, "start"); err != nil {
		return nil, fmt.Errorf("pg_ctl start: %w: %s", err, out)
	}
	return c, nil
}

func (c *pgCluster) data() string { return filepath.Join(c.dir, "data") }

func (c *pgCluster) run(name string, args ...string) (string, error) {
	argv := append(append([]string{}, c.as...), append([]string{filepath.Join(c.bin, name)}, args...)...)
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	return string(out), err
}

func (c *pgCluster) stop() { _, _ = c.run("pg_ctl", "-D", c.data(), "-m", "fast", "-w", "stop") }

// url returns the URL of database name.
func (c *pgCluster) url(name string) string {
	return fmt.Sprintf("postgres://ledger@/%s?host=%s", name, c.dir)
}

func (c *pgCluster) psql(db, sql string) error {
	out, err := c.run("psql", "-h", c.dir, "-U", "ledger", "-d", db, "-q", "-v", "ON_ERROR_STOP=1", "-c", sql)
	if err != nil {
		return fmt.Errorf("psql: %w: %s", err, out)
	}
	return nil
}

// backends runs the matrix and returns its rows.
func backends(ctx context.Context, dir, bin string, clients int, d time.Duration, extra []string) ([]Result, error) {
	pg, err := startPG(dir)
	if err != nil {
		return nil, err
	}
	defer pg.stop()
	var out []Result
	type config struct {
		backend    string
		replicas   int
		namespaces int
	}
	var configs []config
	for _, n := range []int{1, 16} {
		configs = append(configs, config{"sqlite", 1, n}, config{"postgres", 1, n}, config{"postgres", 2, n})
	}
	for i, cf := range configs {
		db := filepath.Join(dir, fmt.Sprintf("matrix-%d.db", i))
		if cf.backend == "postgres" {
			name := fmt.Sprintf("matrix_%d", i)
			if err := pg.psql("postgres", "CREATE DATABASE "+name); err != nil {
				return nil, err
			}
			db = pg.url(name)
		}
		var ls []*ledgerd
		for range cf.replicas {
			l, err := startLedgerd(bin, db, extra)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", cf.backend, err)
			}
			defer l.stop()
			ls = append(ls, l)
		}
		prefixes, err := createNamespaces(ls[0].url, cf.namespaces)
		if err != nil {
			return nil, err
		}
		res, err := drive(ctx, ls, prefixes, "pairs", clients, d)
		for _, l := range ls {
			l.stop()
		}
		if err != nil {
			return nil, err
		}
		res.Mode = fmt.Sprintf("pairs %s ×%d, %d ns", cf.backend, cf.replicas, cf.namespaces)
		out = append(out, res)
	}
	base, err := pgbenchBoth(pg, clients, d)
	return append(out, base...), err
}

// pgbenchBoth runs pgbench's unchained and chained modes.
func pgbenchBoth(pg *pgCluster, clients int, d time.Duration) ([]Result, error) {
	var out []Result
	for _, mode := range []string{"pairs", "chained"} {
		res, err := pgbench(pg, mode, clients, d)
		if err != nil {
			return nil, err
		}
		out = append(out, res)
	}
	return out, nil
}

// pgbench runs the hand-built idempotency table (scripts/baseline/
// postgres.sh's two modes) on the same cluster: pairs is INSERT … ON
// CONFLICT DO NOTHING then UPDATE, two durable transactions per pair;
// chained adds a SHA-256 chain through one head row.
func pgbench(pg *pgCluster, mode string, clients int, d time.Duration) (Result, error) {
	db := "baseline_" + mode
	if err := pg.psql("postgres", "CREATE DATABASE "+db); err != nil {
		return Result{}, err
	}
	if err := pg.psql(db, `CREATE TABLE idem (key text PRIMARY KEY, state text NOT NULL, token text, outcome text, ref text, result jsonb);
CREATE TABLE chain_head (id int PRIMARY KEY, seq bigint NOT NULL, hash bytea NOT NULL);
INSERT INTO chain_head VALUES (1, 0, '\x0000000000000000000000000000000000000000000000000000000000000000');
CREATE TABLE receipts (seq bigint PRIMARY KEY, key text NOT NULL, kind text NOT NULL, hash bytea NOT NULL UNIQUE);`); err != nil {
		return Result{}, err
	}
	script := `\set k random(1, 2000000000)
INSERT INTO idem (key, state, token) VALUES ('k' || :client_id || '-' || :k, 'reserved', md5(random()::text)) ON CONFLICT (key) DO NOTHING;
UPDATE idem SET state = 'succeeded', outcome = 'succeeded', ref = 're_1', result = '{"amount":1200}' WHERE key = 'k' || :client_id || '-' || :k;
`
	if mode == "chained" {
		script = `\set k random(1, 2000000000)
BEGIN;
INSERT INTO idem (key, state, token) VALUES ('c' || :client_id || '-' || :k, 'reserved', md5(random()::text)) ON CONFLICT (key) DO NOTHING;
WITH h AS (UPDATE chain_head SET seq = seq + 1, hash = sha256(hash || convert_to('reserve|c' || :client_id || '-' || :k, 'UTF8')) WHERE id = 1 RETURNING seq, hash)
INSERT INTO receipts SELECT seq, 'c' || :client_id || '-' || :k, 'reserve', hash FROM h;
COMMIT;
BEGIN;
UPDATE idem SET state = 'succeeded', outcome = 'succeeded', ref = 're_1' WHERE key = 'c' || :client_id || '-' || :k;
WITH h AS (UPDATE chain_head SET seq = seq + 1, hash = sha256(hash || convert_to('commit|c' || :client_id || '-' || :k, 'UTF8')) WHERE id = 1 RETURNING seq, hash)
INSERT INTO receipts SELECT seq, 'c' || :client_id || '-' || :k, 'commit', hash FROM h;
COMMIT;
`
	}
	file := filepath.Join(pg.dir, mode+".sql")
	if err := os.WriteFile(file, []byte(script), 0o644); err != nil {
		return Result{}, err
	}
	if len(pg.as) > 0 {
		_ = exec.Command("chown", "nobody:nogroup", file).Run()
	}
	out, err := pg.run("pgbench", "-h", pg.dir, "-U", "ledger", "-n", "-c", strconv.Itoa(clients), "-j", "2",
		"-T", strconv.Itoa(int(d.Seconds())), "-r", "-f", file, db)
	if err != nil {
		return Result{}, fmt.Errorf("pgbench %s: %w: %s", mode, err, out)
	}
	res := Result{Mode: "pgbench " + mode + " (no HTTP)", Clients: clients, Seconds: d.Seconds(), Errors: map[string]int{}}
	if m := regexp.MustCompile(`tps = ([0-9.]+)`).FindStringSubmatch(out); m != nil {
		res.PairsPerS, _ = strconv.ParseFloat(m[1], 64)
		res.RequestsPerS = res.PairsPerS * 2
	}
	if m := regexp.MustCompile(`latency average = ([0-9.]+) ms`).FindStringSubmatch(out); m != nil {
		res.P50Ms, _ = strconv.ParseFloat(m[1], 64) // pgbench reports the mean, shown in the p50 column
	}
	if strings.Contains(out, "failed") {
		if m := regexp.MustCompile(`number of failed transactions: ([0-9]+)`).FindStringSubmatch(out); m != nil && m[1] != "0" {
			res.Errors["failed"], _ = strconv.Atoi(m[1])
		}
	}
	return res, nil
}
