package client_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/effect-ledger/effect-ledger/client"
)

// A gateway wraps a tool call in Do: the refund runs once, and the
// model's second call gets the recorded result back.
func ExampleClient_Do() {
	ledgerClient, err := client.New("http://localhost:8080", client.WithToken(os.Getenv("LEDGER_TOKEN")))
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
			fmt.Println("refunding, Idempotency-Key:", key)
			return client.Outcome{ExternalRef: "re_3Pq9", Result: map[string]any{"amount": 1200, "currency": "eur"}}, nil
		})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("call %d: replayed=%t ref=%s result=%s\n", call, res.Replayed, res.ExternalRef, res.Result)
	}
}

// DeriveKey names an effect by what it does, so that every repeat of the
// same call — whatever the member order of its input — finds the same key.
func ExampleDeriveKey() {
	a, _ := client.DeriveKey("payments.refund", map[string]any{"order": 1234, "amount": 1200})
	b, _ := client.DeriveKey("payments.refund", map[string]any{"order": 1235, "amount": 1200})
	c, _ := client.DeriveKey("payments.refund", struct {
		Amount int `json:"amount"`
		Order  int `json:"order"`
	}{1200, 1234})
	fmt.Println(a)
	fmt.Println(a == c, a == b)
	// Output:
	// dk_31e288fb6af29670771000949272b245789abeec76d397b530b10fb4990778eb
	// true false
}
