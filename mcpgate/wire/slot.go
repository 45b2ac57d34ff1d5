package wire

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// The SDK decodes an upstream's answers into its own types, so the
// upstream connection keeps the raw result of each request made with a
// Slot in its context (WithSlot), and the gateway judges and answers
// with that text.

// Slot receives the raw result of one upstream request, and whether
// the upstream answered it at all: the SDK reports a transport's failure
// (a dropped connection, an HTTP 500) as a JSON-RPC error too, and only
// an answer the upstream sent is an outcome (SPEC §11).
type Slot struct {
	mu       sync.Mutex
	raw      json.RawMessage
	answered bool
	rpcErr   *jsonrpc.Error // the upstream's JSON-RPC error answer
	// written: the request went to the connection's Write (it may have
	// reached the upstream); a request never written cannot have acted.
	written bool
	// strays are ids of answers that came while the request waited and
	// matched no request sent (at most maxStrays), for the log.
	strays []jsonrpc.ID
	// abandoned: the wait for the answer ended; an answer
	// after it is not taken.
	abandoned bool
}

// Abandon ends the wait for the answer: one that comes later is dropped.
// The wait ends with a cancellation sent upstream, and the upstream may
// Answer that ("context canceled"): such an answer is no outcome.
func (s *Slot) Abandon() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.abandoned = true
}

// maxStrays bounds the unmatched answer ids a slot keeps.
const maxStrays = 8

// WasWritten reports whether the request was handed to the connection.
func (s *Slot) WasWritten() bool {
	if s == nil {
		return true // unknown: assume it went
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.written
}

// StrayIDs are the unmatched answer ids seen while the request waited.
func (s *Slot) StrayIDs() []any {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]any, len(s.strays))
	for i, id := range s.strays {
		ids[i] = id.Raw()
	}
	return ids
}

// Get is the raw result the upstream answered, nil if none.
func (s *Slot) Get() json.RawMessage {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.raw
}

// Answer reports what the upstream answered: its JSON-RPC error, if it
// sent one, and whether any answer came.
func (s *Slot) Answer() (rpcErr *jsonrpc.Error, answered bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rpcErr, s.answered
}

// Put records an answer of the upstream: a result or a JSON-RPC error.
func (s *Slot) Put(result json.RawMessage, rpcErr *jsonrpc.Error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.abandoned {
		return
	}
	s.answered = true
	if rpcErr != nil {
		s.rpcErr = rpcErr
		return
	}
	s.raw = bytes.Clone(result)
}

type slotKey struct{}

// WithSlot returns a context whose upstream request keeps its raw
// result in the returned slot.
// A context that has one already (a parked call's) keeps it.
func WithSlot(ctx context.Context) (context.Context, *Slot) {
	if s, ok := SlotOf(ctx); ok {
		return ctx, s
	}
	s := &Slot{}
	return context.WithValue(ctx, slotKey{}, s), s
}

// MarkWritten notes that the request went to the connection: it may
// reach the upstream from here on.
func (s *Slot) MarkWritten() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.written = true
}

// Stray notes an answer whose id matched no request sent, seen while the
// request waited (at most maxStrays).
func (s *Slot) Stray(id jsonrpc.ID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.strays) < maxStrays {
		s.strays = append(s.strays, id)
	}
}

// SlotOf is the slot of ctx's upstream request, if it has one.
func SlotOf(ctx context.Context) (*Slot, bool) {
	s, ok := ctx.Value(slotKey{}).(*Slot)
	return s, ok
}
