package postgres_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/postgres"
	"github.com/effect-ledger/effect-ledger/testkit/pgtest"
	"github.com/effect-ledger/effect-ledger/tlog"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// mustOpen opens a Store on dbURL, closed when tb ends.
func mustOpen(tb testing.TB, dbURL string, opts postgres.Options) *postgres.Store {
	tb.Helper()
	s, err := postgres.Open(context.Background(), dbURL, opts)
	if err != nil {
		tb.Fatalf("open: %v", err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s
}

// mustListen waits until s's LISTEN connection is in place, failing tb
// with msg after 10 s, and returns its backend pid.
func mustListen(tb testing.TB, s *postgres.Store, msg string) uint32 {
	tb.Helper()
	var pid uint32
	require.Eventually(tb, func() bool {
		p, ok := postgres.ListenerPID(s)
		pid = p
		return ok
	}, 10*time.Second, 10*time.Millisecond, msg)
	return pid
}

// mustOpenDefault is mustOpen and the store's default namespace's chain.
func mustOpenDefault(tb testing.TB, dbURL string, opts postgres.Options) (*postgres.Store, *postgres.Chain) {
	tb.Helper()
	s := mustOpen(tb, dbURL, opts)
	return s, mustChain(tb, s, ledger.DefaultNamespace)
}

func mustChain(tb testing.TB, s *postgres.Store, ns string) *postgres.Chain {
	tb.Helper()
	c, err := s.Chain(context.Background(), ns)
	if err != nil {
		tb.Fatalf("chain %s: %v", ns, err)
	}
	return c.(*postgres.Chain)
}

// connect opens a connection to dbURL, failing tb if it cannot; the
// caller closes it.
func connect(tb testing.TB, dbURL string) *pgx.Conn {
	tb.Helper()
	conn, err := pgx.Connect(context.Background(), dbURL)
	if err != nil {
		tb.Fatal(err)
	}
	return conn
}

// psql runs one statement on dbURL.
func psql(tb testing.TB, dbURL, sql string, args ...any) {
	tb.Helper()
	ctx := context.Background()
	conn := connect(tb, dbURL)
	defer func() { _ = conn.Close(ctx) }()
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		tb.Fatalf("%s: %v", sql, err)
	}
}

func txReader(ctx context.Context, tx ledger.Tx) sumdb.HashReader {
	return sumdb.HashReaderFunc(func(idx []int64) ([]tlog.Hash, error) { return tx.ReadHashes(ctx, idx) })
}

// appendReceipt links r to the head, computes its leaf's tree hashes over
// the transaction and appends it, as the domain does.
func appendReceipt(ctx context.Context, tx ledger.Tx, r chain.Receipt) (chain.Receipt, error) {
	h := locked(tx).Head
	if r.RecordedAt == 0 {
		r.RecordedAt = locked(tx).Now
	}
	l := chain.Link(h.Seq, h.Hash, r)
	hs, err := sumdb.StoredHashes(tlog.LeafIndex(l.Seq), l.Hash[:], txReader(ctx, tx))
	if err != nil {
		return l, fmt.Errorf("tree hashes: %w", err)
	}
	return l, tx.Append(ctx, &l, hs)
}

// call describes one effect for reserve/commit.
type call struct {
	key, exec, tool, input string
	attempt                uint64
}

func (c call) receipt(kind string) chain.Receipt {
	return chain.Receipt{Kind: kind, IdempotencyKey: c.key, ExecutionID: c.exec, Attempt: max(c.attempt, 1),
		Tool: c.tool, Effect: chain.EffectWrite, InputHash: c.input}
}

// reserve appends a reserve of c and writes its key record, as the domain
// would for a fresh key or a retry.
func reserve(ctx context.Context, tx ledger.Tx, c call, leaseMS uint64) (chain.Receipt, error) {
	k, found, err := tx.Key(ctx, c.key)
	if err != nil {
		return chain.Receipt{}, err
	}
	r := c.receipt(chain.KindReserve)
	r.LeaseExpiresAt = locked(tx).Now + leaseMS
	if found {
		r.RefSeq = k.ReserveSeq
	}
	l, err := appendReceipt(ctx, tx, r)
	if err != nil {
		return l, err
	}
	if !found {
		k = ledger.KeyRecord{Key: c.key, Tool: c.tool, Effect: chain.EffectWrite, InputHash: c.input, FirstSeq: l.Seq}
	}
	k.ReserveSeq, k.LeaseExpiresAt, k.TokenHash = l.Seq, r.LeaseExpiresAt, "token-"+c.exec
	return l, tx.PutKey(ctx, &k)
}

// finish appends a commit of the key's latest reserve with outcome.
func finish(ctx context.Context, tx ledger.Tx, key, outcome, errorCode string) (chain.Receipt, error) {
	k, found, err := tx.Key(ctx, key)
	if err != nil || !found {
		return chain.Receipt{}, fmt.Errorf("key %s: found %v: %v", key, found, err)
	}
	res, err := tx.Receipt(ctx, k.ReserveSeq)
	if err != nil {
		return chain.Receipt{}, err
	}
	r := chain.Receipt{Kind: chain.KindCommit, IdempotencyKey: key, ExecutionID: res.ExecutionID,
		Attempt: res.Attempt, Tool: res.Tool, Effect: res.Effect, InputHash: res.InputHash,
		Outcome: outcome, ErrorCode: errorCode, RefSeq: res.Seq}
	if outcome == chain.OutcomeSucceeded {
		r.Result = `{"ok":true}`
	} else {
		r.ErrorMessage = "it failed"
	}
	l, err := appendReceipt(ctx, tx, r)
	if err != nil {
		return l, err
	}
	k.FinalSeq = l.Seq
	return l, tx.PutKey(ctx, &k)
}

// reserveKey appends a reserve of key by exec for tool t with a lease of
// a second (reserve).
func reserveKey(ctx context.Context, tx ledger.Tx, key, exec string) error {
	_, err := reserve(ctx, tx, call{key: key, exec: exec, tool: "t"}, 1000)
	return err
}

// update runs fn in c.Update and fails tb on error.
func update(tb testing.TB, c ledger.Chain, fn func(ctx context.Context, tx ledger.Tx) error) {
	tb.Helper()
	if err := c.(*postgres.Chain).Update(context.Background(), fn); err != nil {
		tb.Fatalf("update: %v", err)
	}
}

// allReceipts reads the chain in seq order.
func allReceipts(tb testing.TB, c ledger.Chain) []chain.Receipt {
	tb.Helper()
	var out []chain.Receipt
	if err := c.Receipts(context.Background(), 0, func(r *chain.Receipt) error {
		out = append(out, *r)
		return nil
	}); err != nil {
		tb.Fatal(err)
	}
	return out
}

// checkChain checks that c's receipts are 1…n, linked and hashed, that the
// head is the last one, and that the stored tree hashes are exactly
// those tlog computes over the receipts' hashes.
func checkChain(tb testing.TB, c ledger.Chain) []chain.Receipt {
	tb.Helper()
	ctx := context.Background()
	rs := allReceipts(tb, c)
	var prev chain.Hash
	var stored []tlog.Hash
	mem := sumdb.HashReaderFunc(func(idx []int64) ([]tlog.Hash, error) {
		out := make([]tlog.Hash, len(idx))
		for i, x := range idx {
			out[i] = stored[x]
		}
		return out, nil
	})
	for i := range rs {
		r := &rs[i]
		if r.Seq != uint64(i+1) || r.PrevHash != prev {
			tb.Fatalf("receipt %d: seq %d prev %s, want seq %d prev %s", i, r.Seq, r.PrevHash, i+1, prev)
		}
		if err := r.Check(); err != nil {
			tb.Fatalf("receipt %d: %v", r.Seq, err)
		}
		prev = r.Hash
		hs, err := sumdb.StoredHashes(int64(i), r.Hash[:], mem)
		if err != nil {
			tb.Fatal(err)
		}
		stored = append(stored, hs...)
	}
	head, err := c.Head(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	if head.Seq != uint64(len(rs)) || head.Hash != prev {
		tb.Fatalf("head = %d %s, want %d %s", head.Seq, head.Hash, len(rs), prev)
	}
	size, err := c.TreeSize(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	if size != int64(len(rs)) {
		tb.Fatalf("tree size = %d, want %d", size, len(rs))
	}
	if len(stored) > 0 {
		idx := make([]int64, len(stored))
		for i := range idx {
			idx[i] = int64(i)
		}
		got, err := c.HashReader(ctx).ReadHashes(idx)
		if err != nil {
			tb.Fatal(err)
		}
		for i := range got {
			if got[i] != stored[i] {
				tb.Fatalf("tree hash %d = %x, want %x", i, got[i], stored[i])
			}
		}
	}
	return rs
}

// requireReceipts requires c to check (checkChain) and hold n receipts.
func requireReceipts(tb testing.TB, c ledger.Chain, n int) {
	tb.Helper()
	if got := len(checkChain(tb, c)); got != n {
		tb.Fatalf("%d receipts, want %d", got, n)
	}
}

// requireSecondRun requires c to check and hold one receipt, the one the
// second run of an Update's fn appended (execution run-2).
func requireSecondRun(tb testing.TB, c ledger.Chain) {
	tb.Helper()
	if rs := checkChain(tb, c); len(rs) != 1 || rs[0].ExecutionID != "run-2" {
		tb.Fatalf("receipts %+v, want the second run's one", rs)
	}
}

// backendAddr is the network address of the server of dbURL.
func backendAddr(tb testing.TB, dbURL string) (network, addr string) {
	tb.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		tb.Fatal(err)
	}
	port := u.Port()
	if port == "" {
		port = "5432"
	}
	host := u.Query().Get("host")
	if host == "" {
		host = u.Hostname()
	}
	if strings.HasPrefix(host, "/") {
		return "unix", host + "/.s.PGSQL." + port
	}
	return "tcp", net.JoinHostPort(host, port)
}

// commitDropper is a TCP proxy to a PostgreSQL server that, once armed,
// forwards the next COMMIT to the server but never its reply (or, with
// swallow, drops the COMMIT itself): it then closes both connections, as
// a network that fails at the worst moment.
type commitDropper struct {
	ln      net.Listener
	armed   atomic.Bool
	swallow bool // drop the COMMIT itself rather than its reply
	dropped atomic.Int32
	wg      sync.WaitGroup
}

// newCommitDropper starts the proxy and returns it with the URL of
// dbURL's database through it.
func newCommitDropper(tb testing.TB, dbURL string) (*commitDropper, string) {
	tb.Helper()
	network, addr := backendAddr(tb, dbURL)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &commitDropper{ln: ln}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial(network, addr)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.serve(c, s)
			}()
		}
	}()
	tb.Cleanup(func() {
		_ = ln.Close()
		p.wg.Wait()
	})
	u, _ := url.Parse(dbURL)
	q := u.Query()
	q.Del("host")
	q.Set("sslmode", "disable")
	u.RawQuery = q.Encode()
	u.Host = ln.Addr().String()
	return p, u.String()
}

// commitQuery is the simple-protocol Query message "COMMIT" (pgx sends
// an argument-less Exec so).
var commitQuery = []byte("Q\x00\x00\x00\x0bCOMMIT\x00")

func (p *commitDropper) serve(client, server net.Conn) {
	var dropping atomic.Bool
	done := make(chan struct{})
	go func() { // server → client
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			n, err := server.Read(buf)
			if dropping.Load() {
				return
			}
			if n > 0 {
				if _, werr := client.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				_ = client.Close()
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := client.Read(buf)
		if n > 0 {
			if bytes.Contains(buf[:n], commitQuery) && p.armed.CompareAndSwap(true, false) {
				dropping.Store(true)
				if !p.swallow {
					_, _ = server.Write(buf[:n])
					<-done // the server answered the COMMIT (committed); the answer is dropped
				}
				p.dropped.Add(1)
				_ = client.Close()
				_ = server.Close()
				<-done
				return
			}
			if _, werr := server.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil { // io.EOF or a closed connection
			break
		}
	}
	_ = server.Close()
	_ = client.Close()
	<-done
}

// locked is tx.Locked, which never fails on this driver.
func locked(tx ledger.Tx) ledger.Locked {
	l, _ := tx.Locked(context.Background())
	return l
}

// txPolicySeq is the latest policy receipt's seq in tx.
func txPolicySeq(ctx context.Context, tx ledger.Tx) (uint64, error) {
	l, err := tx.Locked(ctx)
	return l.PolicySeq, err
}
