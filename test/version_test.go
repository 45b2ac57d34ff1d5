package test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"

	buildversion "github.com/effect-ledger/effect-ledger/internal/version"
)

// buildInfo reads what the go command stamped into a binary, independently
// of the binary itself: `go version -m` prints "mod PATH VERSION" and one
// "build KEY=VALUE" line per setting.
func buildInfo(t *testing.T, bin string) (module, version string, settings map[string]string) {
	t.Helper()
	out, err := exec.Command("go", "version", "-m", bin).Output()
	require.NoError(t, err)
	settings = map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 3 && f[0] == "mod":
			module, version = f[1], f[2]
		case len(f) >= 2 && f[0] == "build":
			k, v, _ := strings.Cut(strings.Join(f[1:], " "), "=")
			settings[k] = v
		}
	}
	require.NotEmpty(t, module, "go version -m %s:\n%s", bin, out)
	return module, version, settings
}

// wantFirstLine is the first line --version must print for the binary
// name, derived from its build info: the release tag the go command
// stamped, else the tree's release (vX.Y.Z-dev between releases) and the
// commit, ".dirty" for a tree with changes.
func wantFirstLine(t *testing.T, name string) string {
	_, modVersion, settings := buildInfo(t, filepath.Join(binDir, name))
	rev := settings["vcs.revision"]
	if semver.IsValid(modVersion) && !module.IsPseudoVersion(modVersion) && !strings.Contains(modVersion, "+dirty") {
		return name + " " + modVersion
	}
	if rev == "" {
		return name + " " + buildversion.Release
	}
	short := buildversion.Release + "+" + rev[:min(12, len(rev))]
	if settings["vcs.modified"] == "true" {
		short += ".dirty"
	}
	return name + " " + short
}

// wantVersionLines are the lines --version must print for bin, derived
// from its build info.
func wantVersionLines(t *testing.T, name string) []string {
	module, version, settings := buildInfo(t, filepath.Join(binDir, name))
	want := []string{
		"contract v1.4 (implements v1, v1.1, v1.2, v1.3, v1.4)",
		"module " + module + " " + version,
	}
	if rev := settings["vcs.revision"]; rev != "" {
		line := "revision " + rev
		var extra []string
		if tm := settings["vcs.time"]; tm != "" {
			extra = append(extra, tm)
		}
		if settings["vcs.modified"] == "true" {
			extra = append(extra, "modified")
		}
		if len(extra) > 0 {
			line += " (" + strings.Join(extra, ", ") + ")"
		}
		want = append(want, line)
	}
	return want
}

func TestVersion(t *testing.T) {
	t.Run("ledgerd", func(t *testing.T) {
		db := filepath.Join(t.TempDir(), "ledger.db")
		cmd := exec.Command(filepath.Join(binDir, "ledgerd"), "--version", "--db", db)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		require.NoError(t, cmd.Run(), "exit 0; stderr: %s", stderr.String())
		lines := strings.Split(strings.TrimSuffix(stdout.String(), "\n"), "\n")
		assert.Equal(t, wantFirstLine(t, "ledgerd"), lines[0], "the binary, its version and commit")
		for _, want := range wantVersionLines(t, "ledgerd") {
			assert.Contains(t, lines, want, "stdout:\n%s", stdout.String())
		}
		assert.Empty(t, stderr.String())
		_, err := os.Stat(db)
		assert.True(t, os.IsNotExist(err), "--version opens no database")
	})

	t.Run("ledgerctl", func(t *testing.T) {
		for _, args := range [][]string{{"--version"}, {"version"}} {
			stdout, stderr, code := ledgerctl(t, args...)
			require.Equal(t, 0, code, "ledgerctl %v: %s", args, stderr)
			lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
			assert.Equal(t, wantFirstLine(t, "ledgerctl"), lines[0], "the binary, its version and commit")
			for _, want := range wantVersionLines(t, "ledgerctl") {
				assert.Contains(t, lines, want, "ledgerctl %v:\n%s", args, stdout)
			}
		}

		stdout, stderr, code := ledgerctl(t, "version", "--json")
		require.Equal(t, 0, code, stderr)
		var got struct {
			Binary, Version, Module, Revision, Contract string
			ModuleVersion                               string `json:"module_version"`
			Modified                                    bool
			Contracts                                   []string
		}
		require.NoError(t, json.Unmarshal([]byte(stdout), &got), stdout)
		module, version, settings := buildInfo(t, filepath.Join(binDir, "ledgerctl"))
		assert.Equal(t, "ledgerctl", got.Binary)
		assert.Equal(t, module, got.Module)
		assert.Equal(t, version, got.ModuleVersion)
		assert.Regexp(t, `^v\d+\.\d+\.\d+(-dev)?$`, got.Version, "a release (or the next one's -dev), whatever the go command stamped")
		assert.Equal(t, buildversion.Release, got.Version, "this checkout carries no release tag: the tree's release")
		assert.Equal(t, settings["vcs.revision"], got.Revision)
		assert.Equal(t, settings["vcs.modified"] == "true", got.Modified)
		assert.Equal(t, "v1.4", got.Contract)
		assert.Equal(t, []string{"v1", "v1.1", "v1.2", "v1.3", "v1.4"}, got.Contracts)

		_, stderr, code = ledgerctl(t, "version", "extra")
		assert.Equal(t, 2, code, "a stray argument is a usage error")
		assert.Contains(t, stderr, "unexpected arguments")
	})

	t.Run("EnvDoesNotPrintVersion", func(t *testing.T) {
		// LEDGERD_<NAME> sets every other flag; LEDGERD_VERSION must not turn
		// a service start into a version print and an exit.
		t.Setenv("LEDGERD_VERSION", "true")
		l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"))
		assert.Equal(t, 200, l.Do("GET", "/healthz", "").Status)
		assert.Contains(t, l.Logs(), `"contract":"v1.4"`, "the ready line names the contract")
	})
}
