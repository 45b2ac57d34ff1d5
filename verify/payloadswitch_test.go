package verify_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
	"github.com/effect-ledger/effect-ledger/verify"
)

// buildSwitched writes an inline default namespace that a policy switches
// to committed payloads (SPEC §14): seq 1–2 a success with a reference and
// a result (inline), 3 the switch, 4–5 a success (committed), 6–7 another,
// 8 the erase of the third key (seq 7's values), 9 a later policy.
func buildSwitched(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ledger.db")
	db := ledgertest.Open(t, ledgertest.WithPath(path), ledgertest.Inline())
	srv := httptest.NewServer(api.NewServer(db.Ledger, api.Config{Logger: quiet}))
	defer func() { srv.Close(); require.NoError(t, db.Close()) }()
	r := post(t, srv, "/v1/effects/reserve", `{"idempotency_key":"pay-key-0001","execution_id":"e1","tool":"payments.refund","effect":"write","input":{"order":7}}`, 201)
	post(t, srv, "/v1/effects/pay-key-0001/commit", `{"reservation":"`+r["reservation"].(string)+`","outcome":"succeeded","external_ref":"re_1","result":{"to":"Jane"}}`, 201)
	_, err := db.SetPolicy(context.Background(), json.RawMessage(`{"payloads":"committed"}`), "admin")
	require.NoError(t, err)
	for _, key := range []string{"pay-key-0002", "pay-key-0003"} {
		r = post(t, srv, "/v1/effects/reserve", `{"idempotency_key":"`+key+`","execution_id":"e1","tool":"payments.refund","effect":"write","input":{"key":"`+key+`"}}`, 201)
		post(t, srv, "/v1/effects/"+key+"/commit", `{"reservation":"`+r["reservation"].(string)+`","outcome":"succeeded","external_ref":"re_2","result":{"to":"John"}}`, 201)
	}
	post(t, srv, "/v1/erasures", `{"keys":["pay-key-0001","pay-key-0003"],"reason":"request 17"}`, 201)
	_, err = db.SetPolicy(context.Background(), json.RawMessage(`{"self_approval":"allow"}`), "admin")
	require.NoError(t, err)
	return path
}

// TestVerifier_payloadSwitchTamper: the verifier learns the switch from the
// chain and checks the inline part as inline and the committed part as
// committed; each tamper vector is caught offline (the file) and, where a
// server can show it, online, and by an incremental run pinned after the
// switch.
func TestVerifier_payloadSwitchTamper(t *testing.T) {
	base := buildSwitched(t)
	unguard := []string{`DROP TRIGGER ns_payloads_erase_only`, `DROP TRIGGER ns_erasures_fixed`}
	cases := []struct {
		desc    string
		steps   []string
		rehash  uint64
		want    []string
		offline bool // a server cannot show it (it refuses the chain, or keeps no such value)
		prefix  bool // in the receipts an incremental run pinned at seq 4 trusts
	}{
		{"intact", nil, 0, nil, false, false},
		{"an inline-form value after the switch, rehashed", []string{`UPDATE receipts SET external_ref = 're_2' WHERE seq = 5`}, 5,
			[]string{verify.RulePayloadUncommitted, verify.RulePayloadUnexpected}, true, false},
		{"a commitment in the committed part with its value dropped, rehashed", []string{`UPDATE receipts SET result = '{"to":"John"}' WHERE seq = 5`}, 5,
			[]string{verify.RulePayloadUncommitted, verify.RulePayloadUnexpected}, true, false},
		{"a value kept for a receipt of the inline part", []string{`INSERT INTO ns_payloads (rid, external_ref, external_ref_salt) VALUES (` + rid("2") + `, 're_1', randomblob(16))`}, 0,
			[]string{verify.RulePayloadUnexpected}, true, true},
		{"the switch undone, rehashed: values and an erase in the inline part", []string{`UPDATE receipts SET result = '{}' WHERE seq = 3`}, 3,
			[]string{verify.RulePayloadUnexpected, verify.RuleInvalidField, verify.RuleEraseInvalid}, true, true},
		{"a policy switching back, rehashed", []string{`UPDATE receipts SET result = '{"payloads":"inline","self_approval":"allow"}' WHERE seq = 9`}, 9,
			[]string{verify.RulePolicyUnknown}, true, false},
		{"the switch names inline, rehashed", []string{`UPDATE receipts SET result = '{"payloads":"inline"}' WHERE seq = 3`}, 3,
			[]string{verify.RulePolicyUnknown, verify.RulePayloadUnexpected, verify.RuleInvalidField, verify.RuleEraseInvalid}, true, true},
		{"an erasure listing a receipt of the inline part", []string{`UPDATE ns_erasures SET ranges = '[[2,2],[7,7]]' WHERE seq = 8`}, 0,
			[]string{verify.RuleEraseInvalid}, true, false},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			path := tamperedCopy(t, base, unguard, tc.steps, tc.rehash)
			rd, err := sqlite.OpenReader(context.Background(), path, sqlite.Options{})
			require.NoError(t, err)
			defer rd.Close()
			rep, err := verify.New(rd, verify.Opts{}).Check(context.Background())
			require.NoError(t, err)
			assert.ElementsMatch(t, tc.want, rules(rep), "%+v", rep.Violations)
			if !tc.prefix {
				// An incremental run pinned after the switch learns it
				// from the trusted prefix.
				pin, err := rd.GetReceipt(context.Background(), 4)
				require.NoError(t, err)
				inc, err := verify.New(rd, verify.Opts{Incremental: true,
					Pinned: &verify.Pin{Seq: 4, Hash: pin.Hash.String()}}).Check(context.Background())
				require.NoError(t, err)
				assert.ElementsMatch(t, tc.want, rules(inc), "incremental: %+v", inc.Violations)
			}
			if tc.offline {
				return
			}
			db := openForServing(t, path)
			srv := httptest.NewServer(api.NewServer(db.Ledger, api.Config{Logger: quiet}))
			defer func() { srv.Close(); _ = db.Close() }()
			rep, err = verify.NewRemote(server(t, srv.URL), verify.Opts{}).Check(context.Background())
			require.NoError(t, err)
			assert.ElementsMatch(t, tc.want, rules(rep), "online: %+v", rep.Violations)
		})
	}
}

// listedSwitch is a server that lists another committed_after than its own.
type listedSwitch struct {
	verify.Server
	at uint64
}

func (l listedSwitch) SwitchedAt(context.Context) (uint64, error) { return l.at, nil }

// TestVerifier_payloadSwitchListed: an online run compares the switch the
// server lists (committed_after) with the chain's: the real server's
// agrees (the intact case above); one that lists none, or another seq, is
// derived_state; one listed beyond the chain the run read was appended
// since.
func TestVerifier_payloadSwitchListed(t *testing.T) {
	db := openForServing(t, buildSwitched(t))
	srv := httptest.NewServer(api.NewServer(db.Ledger, api.Config{Logger: quiet}))
	defer func() { srv.Close(); _ = db.Close() }()
	for _, tc := range []struct {
		at   uint64
		want []string
	}{{3, nil}, {0, []string{verify.RuleDerivedState}}, {5, []string{verify.RuleDerivedState}}, {1000, []string{verify.RuleDerivedState}}} {
		rep, err := verify.NewRemote(listedSwitch{server(t, srv.URL), tc.at}, verify.Opts{}).Check(context.Background())
		require.NoError(t, err)
		assert.ElementsMatch(t, tc.want, rules(rep), "listed at %d: %+v", tc.at, rep.Violations)
	}
}

// TestVerifier_payloadSwitchAbsent: a switched namespace read without its
// payload table is payloads_absent at the switch, not before; with
// ReceiptsOnly its committed part is reported unchecked.
func TestVerifier_payloadSwitchAbsent(t *testing.T) {
	for _, receiptsOnly := range []bool{false, true} {
		path := buildSwitched(t)
		tamper(t, path, tamperCase{Steps: stepsOf([]string{`DROP TABLE ns_payloads`, `DROP TABLE ns_erasures`})})
		rd, err := sqlite.OpenReader(context.Background(), path, sqlite.Options{})
		require.NoError(t, err)
		rep, err := verify.New(rd, verify.Opts{ReceiptsOnly: receiptsOnly}).Check(context.Background())
		require.NoError(t, err)
		require.NoError(t, rd.Close())
		assert.True(t, rep.PayloadsUnchecked)
		if receiptsOnly {
			assert.Empty(t, rep.Violations)
			continue
		}
		require.Len(t, rep.Violations, 1, "%+v", rep.Violations)
		assert.Equal(t, verify.RulePayloadsAbsent, rep.Violations[0].Rule)
		assert.Equal(t, uint64(3), rep.Violations[0].Seq)
	}
}

// TestVerifier_inlineNoPayloadTable: an inline namespace that never
// switched needs no payload table.
func TestVerifier_inlineNoPayloadTable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	db := ledgertest.Open(t, ledgertest.WithPath(path), ledgertest.Inline())
	res := testkit.MustReserve(t, db, testkit.ReserveReq("pay-key-0001", "exec-1"))
	testkit.MustCommit(t, db, testkit.Succeed("pay-key-0001", res.Reservation))
	require.NoError(t, db.Close())
	tamper(t, path, tamperCase{Steps: stepsOf([]string{`DROP TABLE ns_payloads`, `DROP TABLE ns_erasures`})})
	rd, err := sqlite.OpenReader(context.Background(), path, sqlite.Options{})
	require.NoError(t, err)
	defer rd.Close()
	rep, err := verify.New(rd, verify.Opts{}).Check(context.Background())
	require.NoError(t, err)
	assert.Empty(t, rep.Violations)
	assert.False(t, rep.PayloadsUnchecked)
	_ = ledger.PayloadsInline
}
