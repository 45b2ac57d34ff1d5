package test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMetrics_payloadBytes drives SPEC §14's ledger_payload_bytes through
// the real binaries on SQLite and PostgreSQL: /metrics reports, by
// namespace, the UTF-8 bytes of the payload values kept beside the chain
// (salts not counted), rising with commits, falling by the erased values'
// bytes after an erase by key (the erase receipt's reason is itself a kept
// value), 0 for an inline namespace, never an erased value anywhere in the
// scrape, and on PostgreSQL the same value from another replica.
func TestMetrics_payloadBytes(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, testPayloadBytes)
}

func testPayloadBytes(t *testing.T, db string) {
	// The gauge is read at each retention interval: short here.
	l := startLedgerdEnv(t, nil, db, "--default-payloads", "committed", "--retention-interval", "50ms")
	require.Equal(t, 201, l.Do("POST", "/v1/namespaces", `{"name":"plain","payloads":"inline"}`).Status)
	marker := randomMarker(t)
	gauge := func(l *Ledgerd, ns string) float64 {
		fam := metricFamilies(t, l)["ledger_payload_bytes"]
		if fam == nil {
			return -1
		}
		assert.Equal(t, dto.MetricType_GAUGE, fam.GetType())
		assert.Contains(t, fam.GetHelp(), "not their salts")
		for _, m := range fam.GetMetric() {
			if len(m.GetLabel()) == 1 && m.GetLabel()[0].GetName() == "namespace" && m.GetLabel()[0].GetValue() == ns {
				return m.GetGauge().GetValue()
			}
		}
		return -1
	}
	settles := func(ns string, want float64, msg string) {
		t.Helper()
		require.Eventually(t, func() bool { return gauge(l, ns) == want }, 20*time.Second, 20*time.Millisecond,
			"%s: ledger_payload_bytes{namespace=%q} = %v, want %v", msg, ns, gauge(l, ns), want)
	}
	settles("default", 0, "an empty committed namespace keeps nothing")

	// Each key's kept values: its external_ref and its result (RFC 8785,
	// as stored), é being two bytes.
	ref := "ref-" + marker
	result := `{"to":"é` + marker + `"}`
	per := float64(len(ref) + len(result))
	for i, ns := range []string{"default", "default", "plain"} {
		path := "/v1/effects/"
		if ns != "default" {
			path = "/v1/ns/" + ns + "/effects/"
		}
		key := fmt.Sprintf("bytes-%08d", i)
		rr := l.Do("POST", path+"reserve", `{"idempotency_key":"`+key+`","execution_id":"e1","tool":"mail.send","effect":"external","input":{"i":`+fmt.Sprint(i)+`}}`)
		require.Equal(t, 201, rr.Status, rr.Raw)
		c := l.Do("POST", path+key+"/commit", `{"reservation":"`+rr.Body["reservation"].(string)+`","outcome":"succeeded","external_ref":"`+ref+`","result":`+result+`}`)
		require.Equal(t, 201, c.Status, c.Raw)
	}
	settles("default", 2*per, "two commits' values")
	settles("plain", 0, "an inline namespace keeps its values in the chain, none beside it")

	const reason = "erasure request 1"
	er := l.Do("POST", "/v1/erasures", `{"keys":["bytes-00000000"],"reason":"`+reason+`"}`)
	require.Equal(t, 201, er.Status, er.Raw)
	settles("default", per+float64(len(reason)), "the erased values' bytes are gone (the erase's reason is kept)")
	assert.NotContains(t, l.Do("GET", "/metrics", "").Raw, marker, "no value is a label")
	if strings.HasPrefix(db, "postgres") {
		// A gauge of the shared database: another replica reports the same.
		b := startLedgerdEnv(t, nil, db, "--retention-interval", "50ms")
		require.Eventually(t, func() bool { return gauge(b, "default") == per+float64(len(reason)) }, 20*time.Second, 20*time.Millisecond,
			"the other replica: %v", gauge(b, "default"))
	}
}
