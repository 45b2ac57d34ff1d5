package test

import (
	"context"
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

// crossInput is the input of the derivation vector the three clients pin
// (client/key_test.go), with a name to make it this test's own.
const crossInput = `{"name":"Zoë Ünal","emails":["zoe@example.com"],"age":41,"score":0.1,"big":1e21,"small":1e-7,"neg":-0.0,"ok":true,"none":null,"€":"euro","é":"e-acute","a\nb":"tab\t\u0001","ns":%q}`

// TestDerivedKeys_acrossClients (SPEC §14) runs one call through the Go
// client, the Python client, the TypeScript client and ledger-mcp
// against a real ledgerd started with --default-payloads committed: each
// derives the same dk2_ key with the namespace's derivation key, so the
// second and later are replays; in an inline namespace they all derive
// the same dk_ key. It needs python3 with httpx and node with npm, which
// .ci/run installs: under CI=true it fails without them.
func TestDerivedKeys_acrossClients(t *testing.T) {
	t.Parallel()
	python := pythonClient(t)
	node, dist := typescriptClient(t)
	ctx := context.Background()
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"), "--default-payloads", "committed")
	r := l.Do("POST", "/v1/namespaces", `{"name":"plain","payloads":"inline"}`)
	require.Equal(t, 201, r.Status, r.Raw)
	sh := newShop(t)

	for _, ns := range []struct{ name, prefix, derived string }{
		{"default", "/v1", "dk2_"}, {"plain", "/v1/ns/plain", "dk_"},
	} {
		dk := derivationKey(t, l, ns.prefix)
		c, err := client.New(l.URL, client.WithNamespace(ns.name))
		require.NoError(t, err)

		// ledger-mcp first, then the Go client: the same call, one effect.
		g := startGateway(t, append([]string{"--ledger", l.URL, "--namespace", ns.name}, sh.command()...)...)
		args := json.RawMessage(`{"order":"DK-` + ns.name + `"}`)
		res := g.call(t, "charge", map[string]any{"order": "DK-" + ns.name}, nil)
		require.False(t, res.IsError, text(t, res))
		replay := g.call(t, "charge", map[string]any{"order": "DK-" + ns.name}, nil)
		assert.Equal(t, true, replay.Meta["io.effect-ledger/replayed"], text(t, replay))
		key, _ := replay.Meta["io.effect-ledger/key"].(string)
		want, err := dk.DeriveKey("test-shop.charge", map[string]any{"arguments": args, "scope": ""})
		require.NoError(t, err)
		assert.Equal(t, want, key, ns.name)
		assert.Regexp(t, "^"+ns.derived+"[0-9a-f]{64}$", key)
		fp, err := client.Fingerprint(args)
		require.NoError(t, err)
		again, err := c.Do(ctx, client.Effect{Tool: "test-shop.charge", Class: client.ClassDestructive, InputHash: fp,
			Input: map[string]any{"arguments": args, "scope": ""}}, failIfRun(t))
		require.NoError(t, err)
		assert.True(t, again.Replayed, "the Go client derives ledger-mcp's key: a replay")
		assert.Equal(t, key, again.Key)
		assert.Equal(t, 1, sh.runs("charge", "DK-"+ns.name))

		// The Go client first, then Python, then TypeScript.
		input := json.RawMessage(fmt.Sprintf(crossInput, ns.name))
		first, err := c.Do(ctx, client.Effect{Tool: "crm.contact.upsert", Class: client.ClassWrite, Input: input},
			func(context.Context, string) (client.Outcome, error) { return client.Outcome{Result: "go"}, nil })
		require.NoError(t, err)
		require.False(t, first.Replayed)
		want, err = dk.DeriveKey("crm.contact.upsert", input)
		require.NoError(t, err)
		assert.Equal(t, want, first.Key)
		assert.Regexp(t, "^"+ns.derived, first.Key)
		for _, run := range []*exec.Cmd{
			exec.Command(python, "-c", pythonDo, l.URL, ns.name, "crm.contact.upsert", string(input)),
			exec.Command(node, "--input-type=module", "-e", nodeDo(dist), l.URL, ns.name, "crm.contact.upsert", string(input)),
		} {
			run.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join("..", "clients", "python", "src"))
			out, stderr, code := runCmd(t, run)
			require.Equal(t, 0, code, "%s: %s", run.Args[0], stderr)
			var got struct {
				Key      string `json:"key"`
				Replayed bool   `json:"replayed"`
			}
			require.NoError(t, json.Unmarshal([]byte(out), &got), out)
			assert.Equal(t, first.Key, got.Key, run.Args[0])
			assert.True(t, got.Replayed, "%s: the same key, a replay", run.Args[0])
		}
	}
}

// pythonDo runs one call through the Python client: argv url, namespace,
// tool, input; prints {"key", "replayed"}.
const pythonDo = `
import json, sys
from effect_ledger import Effect, Ledger
url, ns, tool, inp = sys.argv[1:5]
with Ledger(url, namespace=ns) as c:
    r = c.do(Effect(tool=tool, effect="write", input=json.loads(inp)), lambda key: "python")
print(json.dumps({"key": r.key, "replayed": r.replayed}))
`

// nodeDo is pythonDo for the TypeScript client built in dist.
func nodeDo(dist string) string {
	return `import { Client } from ` + strconv.Quote("file://"+filepath.Join(dist, "index.js")) + `;
const [url, ns, tool, inp] = process.argv.slice(process.argv.length - 4);
const r = await new Client(url, { namespace: ns }).do({ tool, effect: "write", input: JSON.parse(inp) }, async () => ({ result: "ts" }));
console.log(JSON.stringify({ key: r.key, replayed: r.replayed }));`
}

// failIfRun is an effect function that fails the test if it runs.
func failIfRun(t *testing.T) client.Func {
	return func(context.Context, string) (client.Outcome, error) {
		t.Error("the effect ran again")
		return client.Outcome{}, nil
	}
}

// pythonClient returns a python3 that imports httpx (the Python client's
// one dependency). Without one the test is skipped, or fails under
// CI=true (.ci/run installs python3-httpx).
func pythonClient(t *testing.T) string {
	t.Helper()
	for _, py := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(py, "-c", "import httpx").Run() == nil {
			return py
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("python3 with httpx is needed (Debian: apt-get install python3-httpx)")
	}
	t.Skip("no python3 with httpx")
	return ""
}

// typescriptClient builds the TypeScript client (clients/typescript) in a
// copy, from the packages its package-lock.json pins, and returns node
// and the built dist directory. Without node and npm the test is
// skipped, or fails under CI=true.
func typescriptClient(t *testing.T) (node, dist string) {
	t.Helper()
	node, nerr := exec.LookPath("node")
	npm, perr := exec.LookPath("npm")
	if nerr != nil || perr != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("node and npm are needed (Debian: apt-get install nodejs npm)")
		}
		t.Skip("node or npm not installed")
	}
	dir := t.TempDir()
	src := filepath.Join("..", "clients", "typescript")
	require.NoError(t, os.CopyFS(filepath.Join(dir, "src"), os.DirFS(filepath.Join(src, "src"))))
	for _, f := range []string{"package.json", "package-lock.json", "tsconfig.json"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o600))
	}
	for _, args := range [][]string{{npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"}, {npm, "run", "build"}} {
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%v:\n%s", args, out)
	}
	return node, filepath.Join(dir, "dist")
}
