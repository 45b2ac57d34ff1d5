package test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/client"
)

// TestSubjects_acrossClients (SPEC §14): the Go, Python and TypeScript
// clients each send an effect's subjects to a real ledgerd started with
// --default-payloads committed; an erasure by subject (POST /v1/erasures
// {"subject"}) then erases that call's result — the key's GET shows
// erased — and a repeat through the same client is a replay whose result
// says erased (Result.Erased: field → the erase receipt's seq) and whose
// function does not run. It needs python3 with httpx and node with npm,
// as TestDerivedKeys_acrossClients.
func TestSubjects_acrossClients(t *testing.T) {
	t.Parallel()
	python := pythonClient(t)
	node, dist := typescriptClient(t)
	ctx := context.Background()
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"), "--default-payloads", "committed")
	c, err := client.New(l.URL)
	require.NoError(t, err)
	marker := rand.Text()

	for _, who := range []string{"go", "python", "typescript"} {
		key, subject, secret := "subj-"+who+"-"+marker, "customer-"+who+"-"+marker, "secret-"+who+"-"+marker
		run := func(fn client.Func) (replayed bool, erased map[string]uint64, result json.RawMessage) {
			t.Helper()
			if who == "go" {
				res, err := c.Do(ctx, client.Effect{Tool: "crm.note", Class: client.ClassWrite, Key: key, Input: map[string]any{"n": 1},
					Subjects: []string{subject, "team-7"}}, fn)
				require.NoError(t, err)
				return res.Replayed, res.Erased, res.Result
			}
			cmd := exec.Command(python, "-c", pythonSubjects, l.URL, key, subject, secret)
			if who == "typescript" {
				cmd = exec.Command(node, "--input-type=module", "-e", nodeSubjects(dist), l.URL, key, subject, secret)
			}
			cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join("..", "clients", "python", "src"))
			out, stderr, code := runCmd(t, cmd)
			require.Equal(t, 0, code, "%s: %s", who, stderr)
			var got struct {
				Replayed bool              `json:"replayed"`
				Erased   map[string]uint64 `json:"erased"`
				Result   json.RawMessage   `json:"result"`
			}
			require.NoError(t, json.Unmarshal([]byte(out), &got), out)
			return got.Replayed, got.Erased, got.Result
		}
		replayed, erased, result := run(func(context.Context, string) (client.Outcome, error) {
			return client.Outcome{Result: secret}, nil
		})
		require.False(t, replayed, who)
		assert.Empty(t, erased, who)
		assert.JSONEq(t, strconv.Quote(secret), string(result), who)

		k := l.Do("GET", "/v1/effects/"+key, "")
		require.Equal(t, 200, k.Status, k.Raw)
		assert.Contains(t, k.Raw, secret, "%s: the value is there before the erasure", who)
		es := l.Do("POST", "/v1/erasures", `{"subject":"`+subject+`","reason":"erasure request"}`)
		require.Equal(t, 201, es.Status, "%s: the client sent its subject: %s", who, es.Raw)
		seq := uint64(es.Body["receipt"].(map[string]any)["seq"].(float64))
		k = l.Do("GET", "/v1/effects/"+key, "")
		require.Equal(t, 200, k.Status, k.Raw)
		assert.NotContains(t, k.Raw, secret, who)
		assert.Contains(t, k.Raw, fmt.Sprintf(`"erased":{"result":%d}`, seq), who)

		replayed, erased, result = run(failIfRun(t))
		assert.True(t, replayed, who)
		assert.Equal(t, map[string]uint64{"result": seq}, erased, "%s: the replay says what was erased, and by which receipt", who)
		assert.True(t, len(result) == 0 || string(result) == "null", "%s: %s", who, result)
	}
	// The other subject of the Go call still names nothing that holds a value.
	again := l.Do("POST", "/v1/erasures", `{"subject":"team-7"}`)
	assert.Equal(t, 200, again.Status, again.Raw)
}

// pythonSubjects runs one call with subjects through the Python client:
// argv url, key, subject, result; the function fails if it runs twice.
// Prints {"replayed", "erased", "result"}.
const pythonSubjects = `
import json, sys
from effect_ledger import Effect, Ledger
url, key, subject, secret = sys.argv[1:5]
with Ledger(url) as c:
    r = c.do(Effect(tool="crm.note", effect="write", key=key, input={"n": 1}, subjects=[subject]), lambda k: secret)
print(json.dumps({"replayed": r.replayed, "erased": r.erased, "result": r.result}))
`

// nodeSubjects is pythonSubjects for the TypeScript client built in dist.
func nodeSubjects(dist string) string {
	return `import { Client } from ` + strconv.Quote("file://"+filepath.Join(dist, "index.js")) + `;
const [url, key, subject, secret] = process.argv.slice(process.argv.length - 4);
const r = await new Client(url).do({ tool: "crm.note", effect: "write", key, input: { n: 1 }, subjects: [subject] }, async () => ({ result: secret }));
console.log(JSON.stringify({ replayed: r.replayed, erased: r.erased ?? {}, result: r.result }));`
}
