package api_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestServer_races: 100 clients racing on one key get exactly one
// reservation; 100 identical commits give one receipt and identical
// responses; no client ever sees a 503 (no "database is locked").
func TestServer_races(t *testing.T) {
	t.Parallel()
	srv, db := MustOpenServer(t)
	const n = 100
	statuses := make([]int, n)
	tokens := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := do(t, srv, "POST", "/v1/effects/reserve", fmt.Sprintf(`{"idempotency_key":"race-key-0001","execution_id":"exec-%d","tool":"t","effect":"write"}`, i))
			statuses[i] = r.status
			if r.status == 201 {
				tokens[i] = r.body["reservation"].(string)
			} else {
				assert.Equal(t, "in_progress", r.code())
			}
		}()
	}
	wg.Wait()
	var token string
	wins := 0
	for i, s := range statuses {
		if s == 201 {
			wins++
			token = tokens[i]
		} else {
			assert.Equal(t, 409, s)
		}
	}
	require.Equal(t, 1, wins)

	bodies := make([]string, n)
	codes := make([]int, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := do(t, srv, "POST", "/v1/effects/race-key-0001/commit", `{"reservation":"`+token+`","outcome":"succeeded","external_ref":"re_1","result":{"a":1}}`)
			bodies[i], codes[i] = r.raw, r.status
		}()
	}
	wg.Wait()
	created := 0
	for i := range n {
		assert.Equal(t, bodies[0], bodies[i], "identical responses")
		if codes[i] == 201 {
			created++
		} else {
			assert.Equal(t, 200, codes[i])
		}
	}
	assert.Equal(t, 1, created)
	assert.Equal(t, uint64(2), db.Head().Seq, "one reserve, one commit")
}

// TestServer_hostileStrings: strings are stored and returned byte for byte.
func TestServer_hostileStrings(t *testing.T) {
	t.Parallel()
	srv, _ := MustOpenServer(t)
	r := do(t, srv, "POST", "/v1/effects/reserve", `{"idempotency_key":"';DROP/**/TABLE/**/receipts;--","execution_id":"e","tool":"t","effect":"write"}`)
	require.Equal(t, 201, r.status, r.raw)
	ref := "'; DROP TABLE receipts;--\u0000\u2028<script>é"
	r = do(t, srv, "POST", "/v1/effects/%27%3BDROP%2F%2A%2A%2FTABLE%2F%2A%2A%2Freceipts%3B--/commit",
		`{"reservation":"`+r.body["reservation"].(string)+`","outcome":"failed","external_ref":`+mustJSON(ref)+`,"error":{"code":"E","message":"line\nbreak\u0007"}}`)
	require.Equal(t, 201, r.status, r.raw)
	r = do(t, srv, "GET", "/v1/receipts/2", "")
	require.Equal(t, 200, r.status)
	assert.Equal(t, ref, r.body["external_ref"])
	assert.Equal(t, "line\nbreak\u0007", r.body["error_message"])
	assert.Equal(t, "';DROP/**/TABLE/**/receipts;--", r.body["idempotency_key"])
}
