//go:build integration

package release_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/internal/version"
)

const modulePath = "github.com/effect-ledger/effect-ledger"

var commands = []string{"ledgerd", "ledgerctl", "ledger-mcp"}

// ci reports that a missing tool fails the test instead of skipping it.
func ci() bool { return os.Getenv("CI") == "true" }

// need returns the path of tool, or skips the test (fails it under
// CI=true, where .ci/run installs it).
func need(t *testing.T, tool, install string) string {
	t.Helper()
	p, err := exec.LookPath(tool)
	if err != nil {
		if ci() {
			t.Fatalf("%s is needed (%s)", tool, install)
		}
		t.Skipf("%s not installed (%s)", tool, install)
	}
	return p
}

// run runs name with args in dir, env added to the environment, and
// returns its standard output; it fails the test if the command fails.
func run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "%s %s:\n%s\n%s", name, strings.Join(args, " "), stdout.String(), stderr.String())
	return stdout.String()
}

// firstLine is the first line of a --version output.
func firstLine(s string) string { return strings.SplitN(s, "\n", 2)[0] }

// TestRelease_install builds what a release publishes besides the Linux
// cgo binaries (scripts/release -a "" -t … -p -n [-c]) and installs it the
// ways a user does, none from a clone: go install …@version from the
// module proxy, the pure-Go binaries, npx from the npm tarballs, and the
// container image.
func TestRelease_install(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every command for three platforms")
	}
	if runtime.GOOS != "linux" {
		t.Skip("scripts/release runs on Linux")
	}
	npm := need(t, "npm", "Debian: apt-get install nodejs npm")
	// Each target compiles every dependency (minutes): by default the
	// host's static Linux build and one of each other system;
	// RELEASE_TARGETS names others, e.g. all five of a release.
	targets := strings.Fields(os.Getenv("RELEASE_TARGETS"))
	if len(targets) == 0 {
		targets = []string{"linux/" + runtime.GOARCH, "darwin/arm64", "windows/amd64"}
	}
	require.Contains(t, targets, "linux/"+runtime.GOARCH, "RELEASE_TARGETS: the host's static build is installed")
	args := []string{"-a", "", "-t", strings.Join(targets, " "), "-p", "-n"}
	_, buildahErr := exec.LookPath("buildah")
	if buildahErr == nil || ci() {
		args = append(args, "-c")
	}
	out := release(t, root(t), args...)
	v := version.Release

	t.Run("Binaries", func(t *testing.T) {
		check := exec.Command("sha256sum", "-c", "SHA256SUMS")
		check.Dir = out
		b, err := check.CombinedOutput()
		require.NoError(t, err, "sha256sum -c:\n%s", b)
		for _, c := range commands {
			for _, target := range targets {
				f := strings.ReplaceAll(target, "/", "_")
				switch {
				case strings.HasPrefix(target, "linux/"):
					f += "_static"
				case strings.HasPrefix(target, "windows/"):
					f += ".exe"
				}
				assert.Contains(t, string(b), c+"_"+v+"_"+f+": OK")
			}
			// The static build runs here, names its release and needs no
			// C library.
			bin := filepath.Join(out, c+"_"+v+"_linux_"+runtime.GOARCH+"_static")
			assert.Equal(t, c+" "+v+"+"+rev[:12], firstLine(run(t, out, nil, bin, "--version")))
			if file, err := exec.LookPath("file"); err == nil {
				assert.Contains(t, run(t, out, nil, file, bin), "statically linked")
			}
		}
	})

	t.Run("GoInstall", func(t *testing.T) {
		// An empty GOPATH and module cache: both modules come from the
		// release's proxy, every dependency from the module cache of this
		// machine (a proxy too) or else the usual proxy.
		gopath := t.TempDir()
		deps := strings.TrimSpace(run(t, "", nil, "go", "env", "GOMODCACHE"))
		env := []string{
			"GOPATH=" + gopath, "GOMODCACHE=" + filepath.Join(gopath, "pkg", "mod"), "GOBIN=" + filepath.Join(gopath, "bin"),
			"GOWORK=off", "GOFLAGS=-trimpath",
			"GOPROXY=file://" + filepath.Join(out, "goproxy") + ",file://" + filepath.Join(deps, "cache", "download") + ",https://proxy.golang.org",
			"GONOSUMDB=" + modulePath, // not in the checksum database before it is tagged
		}
		pkgs := make([]string, len(commands))
		for i, c := range commands {
			pkgs[i] = modulePath + "/cmd/" + c + "@" + v
		}
		run(t, t.TempDir(), env, "go", append([]string{"install"}, pkgs...)...)
		for _, c := range commands {
			got := run(t, "", nil, filepath.Join(gopath, "bin", c), "--version")
			assert.Equal(t, c+" "+v, firstLine(got))
			assert.Contains(t, got, "\nmodule "+modulePath+" "+v+"\n", got)
		}
	})

	t.Run("Npx", func(t *testing.T) {
		nver := strings.TrimPrefix(v, "v")
		platform := map[string]string{"amd64": "x64", "arm64": "arm64"}[runtime.GOARCH]
		tarballs, err := filepath.Glob(filepath.Join(out, "npm", "*.tgz"))
		require.NoError(t, err)
		var names []string
		for _, tb := range tarballs {
			names = append(names, filepath.Base(tb))
		}
		node := strings.NewReplacer("windows", "win32", "amd64", "x64", "/", "-")
		for _, target := range targets {
			assert.Contains(t, names, "effect-ledger-ledger-mcp-"+node.Replace(target)+"-"+nver+".tgz")
		}
		assert.Len(t, names, len(targets)+1)
		assert.Contains(t, names, "effect-ledger-ledger-mcp-"+nver+".tgz")

		// A scratch project: the MCP SDK and the memory server at the
		// versions test/mcp-node/package-lock.json pins, then the gateway
		// from the release's tarballs (the package with the bin and this
		// platform's binary package; npm would take that one from the
		// registry by its optionalDependencies).
		dir := t.TempDir()
		for _, f := range []string{"package.json", "package-lock.json"} {
			b, err := os.ReadFile(filepath.Join("..", "mcp-node", f))
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o600))
		}
		b, err := os.ReadFile("npx.mjs")
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "npx.mjs"), b, 0o600))
		quiet := []string{"--no-audit", "--no-fund", "--loglevel=error"}
		run(t, dir, nil, npm, append([]string{"ci"}, quiet...)...)
		run(t, dir, nil, npm, append([]string{"install", "--no-save",
			filepath.Join(out, "npm", "effect-ledger-ledger-mcp-"+nver+".tgz"),
			filepath.Join(out, "npm", "effect-ledger-ledger-mcp-linux-"+platform+"-"+nver+".tgz")}, quiet...)...)

		state := t.TempDir()
		got := run(t, dir, []string{"XDG_STATE_HOME=" + state, "MEMORY_FILE_PATH=" + filepath.Join(state, "memory.jsonl")},
			"node", "npx.mjs")
		t.Log(got)
		assert.Equal(t, "ledger-mcp "+v+"+"+rev[:12], firstLine(run(t, dir, nil, "npx", "--no-install", "@effect-ledger/ledger-mcp", "--version")))

		// The call is on the embedded ledger's chain, which verifies.
		db := filepath.Join(state, "effect-ledger", "mcp-memory-server.db")
		ctl := filepath.Join(out, "ledgerctl_"+v+"_linux_"+runtime.GOARCH+"_static")
		run(t, "", nil, ctl, "verify", "--db", db)
		receipts := run(t, "", nil, ctl, "receipts", "--db", db, "--json")
		assert.Contains(t, receipts, `"tool":"memory-server.create_entities"`)
		assert.Contains(t, receipts, `"kind":"replay"`)
	})

	t.Run("Image", func(t *testing.T) {
		if buildahErr != nil && !ci() {
			t.Skip("buildah not installed (Debian: apt-get install buildah)")
		}
		checkImage(t, filepath.Join(out, "ledgerd_"+v+"_image_linux_"+runtime.GOARCH+".tar"))
	})
}

// checkImage opens the image archive tar as a working container, checks
// its configuration and files, and runs its ledgerd --version from the
// mounted filesystem (no container engine needed).
func checkImage(t *testing.T, tar string) {
	t.Helper()
	v := version.Release
	ctr := strings.TrimSpace(run(t, "", nil, "buildah", "from", "--quiet", "oci-archive:"+tar))
	t.Cleanup(func() { _ = exec.Command("buildah", "rm", ctr).Run() })

	var cfg struct {
		OCIv1 struct {
			Config struct {
				User       string
				Entrypoint []string
				Volumes    map[string]struct{}
				WorkingDir string
				Env        []string
			} `json:"config"`
		}
	}
	require.NoError(t, json.Unmarshal([]byte(run(t, "", nil, "buildah", "inspect", "--type", "container", ctr)), &cfg))
	c := cfg.OCIv1.Config
	assert.Equal(t, "65532:65532", c.User, "not root")
	assert.Equal(t, []string{"/usr/local/bin/ledgerd"}, c.Entrypoint)
	assert.Contains(t, c.Volumes, "/var/lib/ledger")
	assert.Equal(t, "/var/lib/ledger", c.WorkingDir)
	assert.Contains(t, c.Env, "LEDGERD_LISTEN=0.0.0.0:8080")

	mnt := strings.TrimSpace(run(t, "", nil, "buildah", "mount", ctr))
	t.Cleanup(func() { _ = exec.Command("buildah", "umount", ctr).Run() })
	var files []string
	require.NoError(t, filepath.Walk(mnt, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(mnt, p)
		if rel == "." {
			return nil // its mode is the storage driver's
		}
		files = append(files, fmt.Sprintf("%s %v", rel, fi.Mode()))
		return nil
	}))
	assert.ElementsMatch(t, []string{
		"etc drwxr-xr-x", "etc/group -rw-r--r--", "etc/passwd -rw-r--r--",
		"usr drwxr-xr-x", "usr/local drwxr-xr-x", "usr/local/bin drwxr-xr-x",
		"usr/local/bin/ledgerd -rwxr-xr-x", "usr/local/bin/ledgerctl -rwxr-xr-x", "usr/local/bin/ledger-mcp -rwxr-xr-x",
		"var drwxr-xr-x", "var/lib drwxr-xr-x", "var/lib/ledger drwxr-xr-x",
	}, files, "the image holds the binaries, the user and the data directory, nothing else")
	passwd, err := os.ReadFile(filepath.Join(mnt, "etc", "passwd"))
	require.NoError(t, err)
	assert.Contains(t, string(passwd), "\nledger:x:65532:65532:")
	fi, err := os.Stat(filepath.Join(mnt, "var", "lib", "ledger"))
	require.NoError(t, err)
	assert.Equal(t, uint32(65532), fi.Sys().(*syscall.Stat_t).Uid)

	got := run(t, "", nil, filepath.Join(mnt, "usr", "local", "bin", "ledgerd"), "--version")
	assert.Equal(t, "ledgerd "+v+"+"+rev[:12], firstLine(got))
}
