// Package test holds end-to-end tests that build the binaries (and
// ledgerd's test build, testdata/ledgerd-test), start ledgerd on a free
// port and drive it over HTTP; starts that ledgerd refuses run its Main
// in-process.
package test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/effect-ledger/effect-ledger/testkit"

	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/testkit/pgtest"
)

// binDir holds the binaries built once for all tests.
var binDir string

// builtOnce returns a function that builds the package pkg (a path
// relative to test/) into binDir/name at its first call and returns the
// binary's path, the same at every later call.
func builtOnce(name, pkg string) func() (string, error) {
	return sync.OnceValues(func() (string, error) {
		bin := filepath.Join(binDir, name)
		if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
			return "", &buildError{out: string(out), err: err}
		}
		return bin, nil
	})
}

type buildError struct {
	out string
	err error
}

func (e *buildError) Error() string { return e.err.Error() + "\n" + e.out }

func TestMain(m *testing.M) {
	flag.Parse()
	parallelByDefault()
	dir, release, err := binaryDir()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	// One go build for the four, so that they compile and link in
	// parallel; with -o a directory each lands under its own name.
	build := exec.Command("go", "build", "-o", dir+string(filepath.Separator),
		"../cmd/ledgerd", "../cmd/ledgerctl", "../cmd/ledger-mcp", "./testdata/"+ledgerdTest)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build ledgerd, ledgerctl, ledger-mcp, "+ledgerdTest+":", err)
		os.Exit(1)
	}
	if err := installOpenAPICheck(); err != nil {
		fmt.Fprintln(os.Stderr, "openapi:", err)
		os.Exit(1)
	}
	code := pgtest.Run(m) // stops the PostgreSQL clusters the replica tests started
	release()
	os.Exit(code)
}

// binaryDir returns the directory the tests build their binaries in, and a function to call
// when they are done with it. It is a directory of the user's cache that belongs to this
// checkout, so that go build finds last run's binaries there and links again only what changed
// (its up-to-date check compares each binary's build ID with its inputs; linking the three
// anew costs ~10 s of CPU). A run holds the directory's lock while it runs; a second run of
// the same checkout at the same time, or a machine without a cache directory, builds in a
// temporary directory instead.
func binaryDir() (string, func(), error) {
	temp := func() (string, func(), error) {
		dir, err := os.MkdirTemp("", "ledger-e2e-bin-")
		return dir, func() { _ = os.RemoveAll(dir) }, err
	}
	cache, err := os.UserCacheDir()
	root, err2 := filepath.Abs("..")
	if err != nil || err2 != nil {
		return temp()
	}
	sum := sha256.Sum256([]byte(root))
	dir := filepath.Join(cache, "effect-ledger-e2e", hex.EncodeToString(sum[:8]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return temp()
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return temp()
	}
	if syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		_ = lock.Close()
		return temp()
	}
	return dir, func() { _ = lock.Close() }, nil
}

// e2eParallel is how many of this package's parallel tests run at once
// unless -parallel says otherwise. They spend most of their time waiting
// on the processes they start (fsyncs, HTTP, a browser), so more of them
// than cores keeps the cores busy: on 2 cores the package takes ~70 s at
// 6 and ~110 s at the default (GOMAXPROCS).
const e2eParallel = 6

// parallelByDefault raises -parallel to e2eParallel when it was not given.
func parallelByDefault() {
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given && runtime.GOMAXPROCS(0) < e2eParallel {
		_ = flag.Set("test.parallel", strconv.Itoa(e2eParallel))
	}
}

// Ledgerd is a running ledgerd process.
type Ledgerd struct {
	t    testing.TB
	cmd  *exec.Cmd
	URL  string
	DB   string
	logs *testkit.Buffer
	exit chan error
}

// StartLedgerd starts ledgerd on db and a free loopback port and waits
// until it logs that it is ready.
func StartLedgerd(t testing.TB, db string, args ...string) *Ledgerd {
	t.Helper()
	return startLedgerdEnv(t, nil, db, args...)
}

// ledgerdTest is the test build of ledgerd (testdata/ledgerd-test): the
// same program with its test seams (a clock, a kill after a commit, a
// full index disk, shorter background periods) set from LEDGERD_TEST_*
// variables, which the ledgerd binary does not read. StartLedgerd starts
// it; tests of the binary itself run binDir/ledgerd.
const ledgerdTest = "ledgerd-test"

// testPeriods shorten ledgerd's background periods in every ledgerd the
// tests start, so that a namespace created while it runs gets its
// checkpoints and verification at once instead of within 2 s.
var testPeriods = []string{"LEDGERD_TEST_NAMESPACE_SCAN_EVERY=20ms"}

// startLedgerdEnv is StartLedgerd with env added to the process's
// environment: per process, so that tests giving ledgerd different
// settings (a test clock) can run in parallel.
func startLedgerdEnv(t testing.TB, env []string, db string, args ...string) *Ledgerd {
	t.Helper()
	return startBinary(t, ledgerdTest, slices.Concat(testPeriods, env), db, args...)
}

// startBinary starts binDir/bin (ledgerd or its test build) with env
// added to the environment, on db and a free loopback port, and waits
// until it logs that it is ready.
func startBinary(t testing.TB, bin string, env []string, db string, args ...string) *Ledgerd {
	t.Helper()
	args = append([]string{"--db", db, "--listen", "127.0.0.1:0", "--log-format", "json"}, args...)
	cmd := exec.Command(filepath.Join(binDir, bin), args...)
	cmd.Env = append(os.Environ(), env...)
	pr, pw := io.Pipe()
	l := &Ledgerd{t: t, cmd: cmd, DB: db, logs: &testkit.Buffer{}, exit: make(chan error, 1)}
	cmd.Stderr = io.MultiWriter(l.logs, pw) // logs first: they hold every line the scanner has seen
	require.NoError(t, cmd.Start())
	go func() {
		l.exit <- cmd.Wait()
		_ = pw.Close()
	}()
	ready := readyAddr(pr, "ledgerd ready", nil)
	select {
	case addr, ok := <-ready:
		require.True(t, ok, "ledgerd exited before it was ready:\n%s", l.logs.String())
		l.URL = "http://" + addr
		watchHost(t, l.URL)
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("ledgerd not ready in 60s:\n%s", l.logs.String())
	}
	t.Cleanup(func() { l.Kill() })
	return l
}

// Stop sends SIGTERM and returns the exit error (nil for exit 0).
func (l *Ledgerd) Stop() error {
	_ = l.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-l.exit:
		l.exit <- err
		return err
	case <-time.After(60 * time.Second):
		_ = l.cmd.Process.Kill()
		return fmt.Errorf("ledgerd did not stop in 60s")
	}
}

// Kill sends SIGKILL and waits for the process to end.
func (l *Ledgerd) Kill() {
	_ = l.cmd.Process.Kill()
	err := <-l.exit
	l.exit <- err
}

// Logs returns what ledgerd wrote to stderr.
func (l *Ledgerd) Logs() string { return l.logs.String() }

// Resp is a decoded response.
type Resp struct {
	Status int
	Header http.Header
	Body   map[string]any
	Raw    string
}

// Code returns the error code of an error response.
func (r Resp) Code() string {
	e, _ := r.Body["error"].(map[string]any)
	c, _ := e["code"].(string)
	return c
}

// Do sends a request with a JSON body (if not empty) and decodes the reply.
func (l *Ledgerd) Do(method, path, body string, header ...string) Resp {
	l.t.Helper()
	req, err := http.NewRequest(method, l.URL+path, strings.NewReader(body))
	require.NoError(l.t, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(l.t, err)
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	require.NoError(l.t, err)
	out := Resp{Status: res.StatusCode, Header: res.Header, Raw: string(raw)}
	if len(raw) > 0 && strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") {
		require.NoError(l.t, json.Unmarshal(raw, &out.Body), "%s", raw)
	}
	return out
}

// rawPost posts a JSON body and returns status and body; a transport error
// (the server was killed) comes back as err.
func rawPost(url, body string) (int, []byte, error) {
	res, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, b, err
}

// field extracts a string field from a JSON object.
func field(b []byte, name string) string {
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	s, _ := m[name].(string)
	return s
}

// recordAck records the receipt of a 2xx response.
func recordAck(mu *sync.Mutex, acks *[]ack, b []byte, key string) {
	var body struct {
		Receipt struct {
			Seq  uint64 `json:"seq"`
			Hash string `json:"hash"`
		} `json:"receipt"`
	}
	if json.Unmarshal(b, &body) == nil && body.Receipt.Seq > 0 {
		mu.Lock()
		*acks = append(*acks, ack{seq: body.Receipt.Seq, hash: body.Receipt.Hash, key: key})
		mu.Unlock()
	}
}
