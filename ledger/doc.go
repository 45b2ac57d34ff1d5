// Package ledger implements the idempotency-key state machine of the effect
// ledger (SPEC §3–4) on top of a hash-chained, append-only chain of
// receipts kept by a storage driver (storage/sqlite, storage/postgres,
// through the ports in store.go). It has no SQL of its own.
//
// Every decision and the receipt it appends happen in one write
// transaction of the driver (Store.Write) that holds the namespace's head,
// in the order the writes were queued (package sched), so a race can never
// give two winners or fork the chain.
package ledger
