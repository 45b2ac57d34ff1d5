package ledgerport

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

// TestLedgerError: the port's errors, the client's and the embedded
// ledger's alike, are a refusal with the contract's code or mean that
// nothing was recorded.
func TestLedgerError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		err     error
		refusal string // the *Refusal's code; "" for ErrUnavailable
	}{
		{"a refusal over HTTP", &client.Error{Status: http.StatusConflict, Code: ledger.ECodeInProgress}, ledger.ECodeInProgress},
		{"a refusal in this process", embeddedError("reserve", &ledger.Error{Code: ledger.ECodeFingerprintMismatch}), ledger.ECodeFingerprintMismatch},
		{"the gate's 403", &client.Error{Status: http.StatusForbidden, Code: ledger.ECodeDeniedByPolicy}, ledger.ECodeDeniedByPolicy},
		{"self-approval denied", &client.Error{Status: http.StatusForbidden, Code: ledger.ECodeSelfApproval}, ledger.ECodeSelfApproval},
		{"an auth 403", &client.Error{Status: http.StatusForbidden, Code: ledger.ECodeForbidden}, ""},
		{"401", &client.Error{Status: http.StatusUnauthorized, Code: "unauthorized"}, ""},
		{"429", &client.Error{Status: http.StatusTooManyRequests, Code: "rate_limited"}, ""},
		{"503", &client.Error{Status: http.StatusServiceUnavailable, Code: ledger.ECodeUnavailable}, ""},
		{"the embedded ledger unavailable", embeddedError("commit", &ledger.Error{Code: ledger.ECodeUnavailable}), ""},
		{"a transport error", errors.New("connection refused"), ""},
	} {
		err := Error("reserve", tc.err)
		var r *Refusal
		if tc.refusal != "" {
			require.ErrorAs(t, err, &r, tc.name)
			assert.Equal(t, tc.refusal, r.Code, tc.name)
			continue
		}
		assert.ErrorIs(t, err, ErrUnavailable, tc.name)
		assert.False(t, errors.As(err, &r), tc.name)
	}
	assert.NoError(t, Error("commit", nil))
	var ce *client.Error
	assert.True(t, errors.As(Error("answer", &client.Error{Status: http.StatusForbidden, Code: ledger.ECodeForbidden}), &ce),
		"an auth 403 keeps the client's error, which tells a policy refusing the client's answer")
}

// TestNewLocal_approvalRequired: the embedded port answers a reserve the
// policy sends to approval as the client does, and the gateway reads it
// as the ask.
func TestNewLocal_approvalRequired(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := ledgertest.Open(t, ledgertest.WithNow(time.Now)).Namespace
	_, err := ns.SetPolicy(ctx, json.RawMessage(`{"rules":[{"tool":"shop.charge","approval":"required"}]}`), "ops")
	require.NoError(t, err)
	port := NewLocal(ns)
	r := client.ReserveRequest{Key: "approval-key-1", ExecutionID: "exec-1", Tool: "shop.charge", Class: client.ClassExternal,
		Input: json.RawMessage(`{"amount":12}`), Lease: time.Minute}
	_, err = port.Reserve(ctx, r)
	var are *client.ApprovalRequiredError
	require.ErrorAs(t, err, &are)
	assert.Equal(t, "approval-key-1", are.IdempotencyKey)
	assert.NotZero(t, are.Seq)

	rsv, err := Port{Ledger: port}.Reserve(ctx, r)
	require.NoError(t, err)
	assert.Equal(t, ledger.StatusApprovalRequired, rsv.Status)
	require.NotNil(t, rsv.Ask)
	assert.Equal(t, are.Seq, rsv.Ask.Seq)
	assert.False(t, rsv.Ask.ExpiresAt.IsZero())
}

// TestNewLocal_derivationKey: the embedded port answers a namespace's
// payload mode and fingerprint key, as GET /v1/derivation-key does.
func TestNewLocal_derivationKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := ledgertest.Open(t)
	require.NoError(t, db.Ledger.CreateNamespace(ctx, "older", ledger.NamespaceSettings{Payloads: ledger.PayloadsInline}))
	older, err := db.Ledger.NS(ctx, "older")
	require.NoError(t, err)
	require.NoError(t, db.Ledger.CreateNamespace(ctx, "people", ledger.NamespaceSettings{Payloads: ledger.PayloadsCommitted}))
	people, err := db.Ledger.NS(ctx, "people")
	require.NoError(t, err)
	for _, tc := range []struct {
		ns   *ledger.Namespace
		mode string
	}{{older, client.PayloadsInline}, {people, client.PayloadsCommitted}} {
		dk, err := Port{Ledger: NewLocal(tc.ns)}.DerivationKey(ctx)
		require.NoError(t, err)
		assert.Equal(t, tc.mode, dk.Payloads)
		want, err := tc.ns.FingerprintKey(ctx)
		require.NoError(t, err)
		assert.Equal(t, want, dk.Key)
	}
}
