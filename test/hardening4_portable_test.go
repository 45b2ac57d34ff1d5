package test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/testkit/pgtest"
)

// Issue 44 item 10, SPEC §9.1: a portable receipt survives re-encoding.
// Every JSON receipt carries result_text; check-proof hashes it and wants
// the embedded result to be the same JSON value (exact decimals).

// Results as a client sends them: spaces, an order of members that is not
// sorted, numbers in several forms, escapes; and numbers no float64 holds.
const (
	portableResult = `{"z": [1.0, 2.50, 1e2, -0, 0.1], "amount": 1200, "s": "<&> \u00e9\u2028", "nested": {"b": null, "a": true}}`
	portableBig    = `{"id": 9007199254740993, "big": 123456789012345678901234567890, "ok": true}`
)

// portableLedger is a signed ledger holding the two results committed
// (keys portable-0001 and portable-0002, receipts 1–4), checkpointed.
type portableLedger struct {
	l    *Ledgerd
	vkey string
}

func startPortable(t *testing.T, backend string) portableLedger {
	t.Helper()
	dir := t.TempDir()
	var l *Ledgerd
	var vkey string
	if backend == "sqlite" {
		l, vkey, _ = startSigned(t, dir, "--default-payloads", "inline") // §9.1's results are inline ones
	} else {
		var key string
		key, vkey = keygen(t, dir, "ex.test")
		l = StartLedgerd(t, pgtest.URL(t), "--signing-key", key, "--log-origin", "ex.test", "--checkpoint-interval", "20ms", "--default-payloads", "inline")
	}
	for _, kr := range [][2]string{{"portable-0001", portableResult}, {"portable-0002", portableBig}} {
		key, result := kr[0], kr[1]
		tok := l.Reserve(t, `{"idempotency_key":"`+key+`","execution_id":"exec-1","tool":"payments.refund","effect":"write"}`)
		l.Commit(t, key, `{"reservation":"`+tok+`","outcome":"succeeded","result":`+result+`}`)
	}
	waitCheckpoint(t, l, vkey, 4)
	return portableLedger{l: l, vkey: vkey}
}

// prove returns the portable receipt of key's commit, from the server
// (the database gives the same bytes).
func (p portableLedger) prove(t *testing.T, key string) string {
	t.Helper()
	out, stderr, code := ledgerctl(t, "prove", "--server", p.l.URL, key)
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2, "the reserve and the commit")
	dbOut, stderr, code := ledgerctl(t, "prove", "--db", p.l.DB, key)
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, out, dbOut, "the same portable receipts from the database")
	return lines[1]
}

// checkProof runs ledgerctl check-proof on doc and returns its output and
// exit code.
func (p portableLedger) checkProof(t *testing.T, doc string) (string, int) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "receipt.json")
	require.NoError(t, os.WriteFile(f, []byte(doc), 0o644))
	out, stderr, code := ledgerctl(t, "check-proof", f, "--vkey", p.vkey)
	return out + stderr, code
}

// TestPortableReceipt_survivesReencoding: a portable receipt re-encoded by
// jq, Go's encoding/json (maps: members sorted) and Python's json still
// checks; on SQLite and PostgreSQL. Fails on main, where the result's
// changed bytes no longer hash.
func TestPortableReceipt_survivesReencoding(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"sqlite", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			p := startPortable(t, backend)
			small, big := p.prove(t, "portable-0001"), p.prove(t, "portable-0002")
			var pr struct {
				Receipt struct {
					Result     json.RawMessage `json:"result"`
					ResultText *string         `json:"result_text"`
				} `json:"receipt"`
			}
			require.NoError(t, json.Unmarshal([]byte(small), &pr))
			stored := compactJSON(t, portableResult)
			if assert.NotNil(t, pr.Receipt.ResultText, "the portable receipt carries result_text: %s", small) {
				assert.Equal(t, stored, *pr.Receipt.ResultText, "the stored text")
			}
			assert.Equal(t, stored, string(pr.Receipt.Result), "and the result embedded verbatim")

			for _, doc := range []string{small, big} {
				out, code := p.checkProof(t, doc)
				require.Equal(t, 0, code, out)
			}
			accept := func(how, doc string) {
				t.Helper()
				out, code := p.checkProof(t, doc)
				assert.Equal(t, 0, code, "%s: %s\n%s", how, out, doc)
				assert.Contains(t, out, "valid: receipt", how)
			}
			refuseBig := func(how, doc string) {
				t.Helper()
				out, code := p.checkProof(t, doc)
				assert.Equal(t, 1, code, "%s: %s", how, out)
				assert.Contains(t, out, "INVALID: receipt 4 (key portable-0002)", how)
				assert.Contains(t, out, "the embedded result does not equal result_text", how)
				assert.Regexp(t, `at \$\.(big: \S+ in result, 123456789012345678901234567890|id: \S+ in result, 9007199254740993) in result_text`, out, how)
			}

			// Go: members sorted, indented, strings re-escaped (<&> as
			// \u003c…), numbers kept as written with UseNumber.
			for _, doc := range []string{small, big} {
				re := goReencode(t, doc, true)
				require.NotContains(t, re, stored)
				accept("encoding/json with UseNumber", re)
			}
			// Plain map[string]any: numbers become float64. What float64
			// holds exactly still checks; 9007199254740993 is not what was
			// signed, and the receipt is refused rather than shown wrong.
			accept("encoding/json with float64", goReencode(t, small, false))
			refuseBig("encoding/json with float64", goReencode(t, big, false))

			if _, err := exec.LookPath("jq"); err != nil {
				t.Log("jq is not installed: not re-encoded with jq")
			} else {
				accept("jq -S", pipe(t, small, "jq", "-S", "."))
				accept("jq -c", pipe(t, small, "jq", "-c", "."))
				// jq before 1.7 reads numbers as doubles; 1.7 keeps literals.
				if re := pipe(t, big, "jq", "-S", "."); regexp.MustCompile(`"id": 9007199254740993`).MatchString(re) {
					accept("jq -S (numbers kept)", re)
				} else {
					refuseBig("jq -S (numbers rounded to doubles)", re)
				}
			}
			if _, err := exec.LookPath("python3"); err != nil {
				t.Log("python3 is not installed: not re-encoded with Python")
			} else {
				script := "import json,sys\nfor l in sys.stdin:\n  print(json.dumps(json.loads(l), sort_keys=True, indent=1))\n"
				for _, doc := range []string{small, big} {
					accept("python json", pipe(t, doc, "python3", "-c", script))
				}
			}
		})
	}
}

// TestPortableReceipt_resultNotResultTextRefused: a portable receipt whose
// result and result_text disagree is invalid, whichever was changed and
// however small the change; one without result_text checks as before.
func TestPortableReceipt_resultNotResultTextRefused(t *testing.T) {
	t.Parallel()
	p := startPortable(t, "sqlite")
	small, big := p.prove(t, "portable-0001"), p.prove(t, "portable-0002")
	quotedBig := `\"id\":9007199254740993`
	require.Contains(t, big, `"id":9007199254740993`)
	require.Contains(t, big, quotedBig)
	for _, tc := range []struct{ desc, doc, want string }{
		{"result altered", strings.Replace(small, `"amount":1200`, `"amount":9200`, 1),
			"at $.amount: 9200 in result, 1200 in result_text"},
		{"result_text altered", strings.Replace(small, `\"amount\":1200`, `\"amount\":9200`, 1),
			"at $.amount: 1200 in result, 9200 in result_text"},
		{"a number no float64 tells apart", strings.Replace(big, `"id":9007199254740993`, `"id":9007199254740992`, 1),
			"at $.id: 9007199254740992 in result, 9007199254740993 in result_text"},
		{"a member added to result", strings.Replace(small, `"nested":{"b":null,"a":true}}`, `"nested":{"b":null,"a":true,"c":1}}`, 1),
			"at $.nested.c: 1 in result, absent in result_text"},
		{"a member twice in result", strings.Replace(small, `"nested":{"b":null,"a":true}}`, `"nested":{"b":null,"a":true,"a":false}}`, 1),
			`result: member name "a" appears twice`},
		{"an order of the array changed", strings.Replace(small, `[1.0,2.50,`, `[2.50,1.0,`, 1),
			"at $.z[0]: 2.50 in result, 1.0 in result_text"},
		{"result null", strings.Replace(small, `"result":`+compactJSON(t, portableResult)+`,`, `"result":null,`, 1),
			"result is null, result_text is not empty"},
		{"both altered alike", strings.Replace(strings.Replace(small, `"amount":1200`, `"amount":9200`, 1), `\"amount\":1200`, `\"amount\":9200`, 1),
			"the receipt's fields do not hash to its hash"},
	} {
		require.NotEqual(t, small, tc.doc, tc.desc)
		out, code := p.checkProof(t, tc.doc)
		assert.Equal(t, 1, code, "%s: %s", tc.desc, out)
		assert.Contains(t, out, "INVALID: receipt", tc.desc)
		assert.Contains(t, out, tc.want, tc.desc)
	}

	// Without result_text, the exact bytes of result are hashed as before:
	// valid as served, invalid once re-encoded.
	for _, doc := range []string{small, big} {
		var pr struct {
			Receipt struct {
				ResultText string `json:"result_text"`
			} `json:"receipt"`
		}
		require.NoError(t, json.Unmarshal([]byte(doc), &pr))
		without := strings.Replace(doc, `,"result_text":`+string(chain.AppendJSONString(nil, pr.Receipt.ResultText)), "", 1)
		require.NotContains(t, without, "result_text")
		out, code := p.checkProof(t, without)
		assert.Equal(t, 0, code, "without result_text: %s", out)
		out, code = p.checkProof(t, goReencode(t, without, true))
		assert.Equal(t, 1, code, "without result_text, re-encoded: %s", out)
		assert.Contains(t, out, "do not hash")
	}
}

// TestJSONReceipts_carryResultText: every JSON receipt (the API's pages,
// one receipt, a key's view, ledgerctl's --json outputs and export) carries
// result_text, the stored text as a string; the online verifier reads them.
func TestJSONReceipts_carryResultText(t *testing.T) {
	t.Parallel()
	p := startPortable(t, "sqlite")
	stored := compactJSON(t, portableBig)
	want := `"result":` + stored + `,"result_text":` + string(chain.AppendJSONString(nil, stored)) + `,`
	for _, path := range []string{"/v1/receipts", "/v1/receipts/4", "/v1/effects/portable-0002", "/v1/receipts/4/proof"} {
		r := p.l.Do("GET", path, "")
		require.Equal(t, 200, r.Status, r.Raw)
		assert.Contains(t, r.Raw, want, path)
		if !strings.HasPrefix(path, "/v1/receipts/4") {
			assert.Contains(t, r.Raw, `"result":null,"result_text":"",`, "a reserve has none: %s", path)
		}
	}
	for _, args := range [][]string{
		{"receipts", "--json"}, {"show", "--json", "portable-0002"}, {"export"}, {"prove", "4"},
	} {
		for _, src := range [][]string{{"--db", p.l.DB}, {"--server", p.l.URL}} {
			cmd := append(append([]string{args[0]}, src...), args[1:]...)
			out, stderr, code := ledgerctl(t, cmd...)
			require.Equal(t, 0, code, "%v: %s", cmd, stderr)
			assert.Contains(t, out, want, "%v", cmd)
		}
	}
	out, stderr, code := ledgerctl(t, "verify", "--server", p.l.URL)
	assert.Equal(t, 0, code, "%s%s", out, stderr)
}

// compactJSON returns doc as the ledger stores it.
func compactJSON(t *testing.T, doc string) string {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, json.Compact(&b, []byte(doc)))
	return b.String()
}

// goReencode passes each JSON document of doc through encoding/json as
// maps (members sorted, indented); numbers stay literals with useNumber,
// else become float64.
func goReencode(t *testing.T, doc string, useNumber bool) string {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(doc))
	if useNumber {
		dec.UseNumber()
	}
	var out strings.Builder
	for dec.More() {
		var v any
		require.NoError(t, dec.Decode(&v))
		b, err := json.MarshalIndent(v, "", "  ")
		require.NoError(t, err)
		out.Write(b)
		out.WriteByte('\n')
	}
	return out.String()
}

// pipe runs a command with doc on its standard input and returns its
// output.
func pipe(t *testing.T, doc string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Stdin = strings.NewReader(doc)
	out, stderr, code := runCmd(t, cmd)
	require.Equal(t, 0, code, "%s: %s", name, stderr)
	return out
}
