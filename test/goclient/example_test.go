package goclient_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
)

// startLedger runs a real ledger server on a temporary SQLite file for
// the examples and returns its URL and a function that stops it. In
// production the client points at your ledgerd instead.
func startLedger() (string, func()) {
	dir, err := os.MkdirTemp("", "ledger-example-")
	if err != nil {
		log.Fatal(err)
	}
	store, err := sqlite.OpenStore(context.Background(), filepath.Join(dir, "ledger.db"), sqlite.Options{Logger: quiet}, false)
	if err != nil {
		log.Fatal(err)
	}
	db := ledger.New(store, ledger.Config{Logger: quiet})
	srv := httptest.NewServer(api.NewServer(db, api.Config{Logger: quiet}))
	return srv.URL, func() {
		srv.Close()
		_ = db.Close()
		_ = os.RemoveAll(dir)
	}
}

// A gateway wraps a tool call in Do: the refund runs once, and the
// model's second call gets the recorded result back.
func Example_do() {
	url, stop := startLedger()
	defer stop()

	ledgerClient, err := client.New(url) // "localhost:8080" works too
	if err != nil {
		log.Fatal(err)
	}
	refund := client.Effect{
		Tool:       "payments.refund",
		Class:      client.ClassWrite,
		Input:      map[string]any{"order": 1234, "amount": 1200},
		Idempotent: true, // the PSP dedupes on the key we pass it
	}
	for call := 1; call <= 2; call++ {
		res, err := ledgerClient.Do(context.Background(), refund, func(ctx context.Context, key string) (client.Outcome, error) {
			// A new ledger keys its derived keys (dk2_ + an HMAC under the
			// namespace's own key, contract §14), so they differ by ledger.
			fmt.Println("refunding, Idempotency-Key:", key[:len("dk2_")]+"…")
			return client.Outcome{ExternalRef: "re_3Pq9", Result: map[string]any{"amount": 1200, "currency": "eur"}}, nil
		})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("call %d: replayed=%t ref=%s result=%s\n", call, res.Replayed, res.ExternalRef, res.Result)
	}
	// Output:
	// refunding, Idempotency-Key: dk2_…
	// call 1: replayed=false ref=re_3Pq9 result={"amount":1200,"currency":"eur"}
	// call 2: replayed=true ref=re_3Pq9 result={"amount":1200,"currency":"eur"}
}

// A failure is recorded with a code. A retryable failure of an idempotent
// effect may run again; a permanent one is refused with
// ErrRetryNotAllowed.
func Example_failure() {
	url, stop := startLedger()
	defer stop()
	ledgerClient, err := client.New(url)
	if err != nil {
		log.Fatal(err)
	}
	send := client.Effect{Tool: "email.send", Class: client.ClassExternal, Idempotent: true,
		Input: map[string]any{"to": "ada@example.com", "template": "welcome"}}

	_, err = ledgerClient.Do(context.Background(), send, func(ctx context.Context, key string) (client.Outcome, error) {
		return client.Outcome{}, client.Permanent("MAILBOX_UNKNOWN", errors.New("550 no such user"))
	})
	var failed *client.EffectError
	if errors.As(err, &failed) {
		fmt.Println("recorded failure:", failed.Failure.Code)
	}

	_, err = ledgerClient.Do(context.Background(), send, func(ctx context.Context, key string) (client.Outcome, error) {
		panic("not reached: the ledger refuses to send again")
	})
	fmt.Println("sent again?", !errors.Is(err, client.ErrRetryNotAllowed))
	// Output:
	// recorded failure: MAILBOX_UNKNOWN
	// sent again? false
}

// When the ledger cannot be reached after the effect ran, Do returns a
// CommitError that carries what is needed to record the outcome later.
func Example_commitError() {
	url, stop := startLedger()
	defer stop()
	ledgerClient, err := client.New(url)
	if err != nil {
		log.Fatal(err)
	}
	var ce *client.CommitError // as Do would return it
	rsv, err := ledgerClient.Reserve(context.Background(), client.ReserveRequest{
		Key: "refund-order-1234", ExecutionID: "exec-1", Tool: "payments.refund", Class: client.ClassWrite})
	if err != nil {
		log.Fatal(err)
	}
	ce = &client.CommitError{Key: rsv.Key, Reservation: rsv.Token,
		Commit: client.Commit{Outcome: "succeeded", ExternalRef: "re_3Pq9"}}

	// Later, from a retry queue:
	res, err := ledgerClient.Commit(context.Background(), ce.Key, ce.Reservation, ce.Commit)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Outcome, res.Receipt.Seq)
	// Output:
	// succeeded 2
}
