// Package testkit is the driver-free base of the test kits kept under
// testkit/: the fixed epoch T0, a settable clock starting there, and the
// requests tests send. Every package's tests use these, the drivers'
// conformance suite (testkit/storetest) among them; beside it
// testkit/ledgertest opens a ledger over SQLite, testkit/pgtest gives a
// PostgreSQL database, testkit/testwitness a witness, testkit/openapicheck
// checks exchanges against the OpenAPI document, and testkit/gen writes
// large ledgers for benchmarks. No product package imports a test kit.
package testkit

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/stretchr/testify/require"
)

// T0 is the fixed epoch of the tests, in unix milliseconds
// (2025-11-30T04:00:00Z): the SPEC test vector's recorded_at, and where
// every Clock starts. It is untyped, so it serves as an int64, a uint64
// or, through time.UnixMilli, a time.
const T0 = 1764475200000

// Clock is a settable test clock, safe for concurrent use. Tests hand its
// Now to the code under test and move it with Advance or Set.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a clock stopped at T0.
func NewClock() *Clock { return &Clock{t: time.UnixMilli(T0)} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock by d (back when d is negative).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// ReserveReq is a write request for key by execution exec.
func ReserveReq(key, exec string) ledger.ReserveRequest {
	return ledger.ReserveRequest{IdempotencyKey: key, ExecutionID: exec, Tool: "payments.refund",
		Effect: chain.EffectWrite, Input: json.RawMessage(`{"order":7}`)}
}

// Succeed is a successful outcome of key's reservation token.
func Succeed(key, token string) ledger.CommitRequest {
	return ledger.CommitRequest{IdempotencyKey: key, Reservation: token, Outcome: chain.OutcomeSucceeded,
		ExternalRef: "re_1", Result: json.RawMessage(`{"amount": 1200}`)}
}

// Fail is a failed outcome of key's reservation token.
func Fail(key, token string, retryable bool) ledger.CommitRequest {
	return ledger.CommitRequest{IdempotencyKey: key, Reservation: token, Outcome: chain.OutcomeFailed,
		Error: &ledger.FailureDetail{Code: "TIMEOUT", Message: "gateway timed out", Retryable: retryable}}
}

// Writer is what tests reserve and commit on: a ledger.Namespace, or a
// test ledger through its default namespace.
type Writer interface {
	Reserve(ctx context.Context, r ledger.ReserveRequest) (*ledger.ReserveResult, error)
	Commit(ctx context.Context, c ledger.CommitRequest) (*ledger.CommitResult, error)
}

// MustReserve reserves on w and fails tb on error.
func MustReserve(tb testing.TB, w Writer, req ledger.ReserveRequest) *ledger.ReserveResult {
	tb.Helper()
	res, err := w.Reserve(context.Background(), req)
	require.NoError(tb, err)
	return res
}

// MustCommit commits on w and fails tb on error.
func MustCommit(tb testing.TB, w Writer, req ledger.CommitRequest) *ledger.CommitResult {
	tb.Helper()
	res, err := w.Commit(context.Background(), req)
	require.NoError(tb, err)
	return res
}

// CommitBody is the JSON body of a commit over HTTP of the reservation
// token with outcome and the further members extra
// (`,"external_ref":"re_1"`).
func CommitBody(token, outcome, extra string) string {
	return fmt.Sprintf(`{"reservation":%q,"outcome":%q%s}`, token, outcome, extra)
}

// Buffer is a bytes.Buffer that goroutines may share: the log
// destination of a server or an index under test.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// CopyFile copies the file src, such as a closed ledger's (no WAL left
// behind), to dst.
func CopyFile(tb testing.TB, src, dst string) {
	tb.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o600); err != nil {
		tb.Fatal(err)
	}
}

// EditLedger edits the stopped SQLite ledger file at path as someone with
// sqlite3 would: fn runs on one connection to it, with the append-only
// triggers dropped and the table receipts that SPEC §2 names editable
// (EditableReceipts). The caller imports the SQLite driver.
func EditLedger(t testing.TB, path string, fn func(db *sql.DB)) {
	t.Helper()
	db, err := sql.Open("sqlite3", path)
	require.NoError(t, err)
	defer func() { require.NoError(t, db.Close()) }()
	db.SetMaxOpenConns(1)
	EditableReceipts(t, db)
	fn(db)
}

// EditableReceipts drops the append-only triggers of the SQLite ledger
// file open on db (one connection: the temp triggers below live on it)
// and makes its table receipts editable as SPEC §2 names it: since
// schema 7 receipts is a view of the default chain in ns_receipts, so
// temp triggers carry its UPDATEs, DELETEs and INSERTs to the rows it
// shows.
func EditableReceipts(t testing.TB, db *sql.DB) {
	t.Helper()
	for _, q := range []string{`DROP TRIGGER IF EXISTS receipts_no_update`, `DROP TRIGGER IF EXISTS receipts_no_delete`,
		`DROP TRIGGER IF EXISTS ns_receipts_no_update`, `DROP TRIGGER IF EXISTS ns_receipts_no_delete`} {
		_, err := db.Exec(q)
		require.NoError(t, err, q)
	}
	var view int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM sqlite_schema WHERE type = 'view' AND name = 'receipts'`).Scan(&view))
	if view == 0 {
		return // a file of schema 6 or before: receipts is a table
	}
	rows, err := db.Query(`SELECT name FROM pragma_table_info('receipts') ORDER BY cid`) // the view's columns
	require.NoError(t, err)
	var set, news []string
	for rows.Next() {
		var c string
		require.NoError(t, rows.Scan(&c))
		set, news = append(set, c+" = NEW."+c), append(news, "NEW."+c)
	}
	require.NoError(t, errors.Join(rows.Err(), rows.Close()))
	_, err = db.Exec(`CREATE TEMP TRIGGER receipts_update INSTEAD OF UPDATE ON receipts
		BEGIN UPDATE ns_receipts SET ` + strings.Join(set, ", ") + ` WHERE ns = 0 AND seq = OLD.seq; END;
		CREATE TEMP TRIGGER receipts_delete INSTEAD OF DELETE ON receipts
		BEGIN DELETE FROM ns_receipts WHERE ns = 0 AND seq = OLD.seq; END;
		CREATE TEMP TRIGGER receipts_insert INSTEAD OF INSERT ON receipts
		BEGIN INSERT INTO ns_receipts VALUES (0, ` + strings.Join(news, ", ") + `); END;`)
	require.NoError(t, err)
}

// Dial opens a TCP connection to addr for a raw HTTP exchange, its reads
// and writes bounded by d from now; it closes when the test ends.
func Dial(t testing.TB, addr string, d time.Duration) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(d)))
	return c
}

// SlowBody starts a reserve, with the further header lines header
// ("Name: value\r\n"), whose body never finishes arriving, at the HTTP
// server at addr, and returns its connection once the server has begun
// to read the body (its 100 Continue). The connection closes when the
// test ends, before a server started earlier in the test is stopped.
func SlowBody(t testing.TB, addr, header string) net.Conn {
	t.Helper()
	c := Dial(t, addr, 60*time.Second)
	_, err := io.WriteString(c, "POST /v1/effects/reserve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
		"Content-Length: 200\r\nExpect: 100-continue\r\n"+header+"\r\n")
	require.NoError(t, err)
	line, err := bufio.NewReader(c).ReadString('\n')
	require.NoError(t, err, "no 100 Continue")
	require.Equal(t, "HTTP/1.1 100 Continue\r\n", line)
	return c
}

// ReadTimeoutPassed opens a connection to the HTTP server at addr whose
// request body never finishes and returns once the server has cut it for
// its read timeout: by then that timeout, and a write timeout no longer
// than it, has run out for every request whose headers the server read
// before this one's.
func ReadTimeoutPassed(t testing.TB, addr string) {
	t.Helper()
	c := Dial(t, addr, 60*time.Second)
	_, err := io.WriteString(c, "POST /v1/effects/reserve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
		"Content-Length: 200\r\n\r\n{")
	require.NoError(t, err)
	_, err = io.Copy(io.Discard, c) // whatever the server answers, until it closes the connection
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the server did not cut a request body that never came")
}
