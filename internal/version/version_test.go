package version_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/mod/modfile"
	"golang.org/x/mod/semver"

	"github.com/effect-ledger/effect-ledger/internal/version"
)

const rev = "6aedb58a1b2c3d4e5f60718293a4b5c6d7e8f901"

func build(v string, settings ...string) *debug.BuildInfo {
	bi := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "github.com/effect-ledger/effect-ledger", Version: v}}
	for i := 0; i+1 < len(settings); i += 2 {
		bi.Settings = append(bi.Settings, debug.BuildSetting{Key: settings[i], Value: settings[i+1]})
	}
	return bi
}

func TestFromBuildInfo(t *testing.T) {
	for _, tc := range []struct {
		desc      string
		bi        *debug.BuildInfo
		wantShort string
		wantLines []string
	}{
		{
			desc:      "release tag",
			bi:        build("v1.2.0", "vcs.revision", rev, "vcs.time", "2026-12-01T01:39:27Z", "vcs.modified", "false"),
			wantShort: "v1.2.0",
			wantLines: []string{"ledgerd v1.2.0", "module github.com/effect-ledger/effect-ledger v1.2.0", "revision " + rev + " (2026-12-01T01:39:27Z)"},
		},
		{
			desc:      "checkout with changes",
			bi:        build("v0.0.0-20261201013927-6aedb58a1b2c+dirty", "vcs.revision", rev, "vcs.time", "2026-12-01T01:39:27Z", "vcs.modified", "true"),
			wantShort: version.Release + "+6aedb58a1b2c.dirty",
			wantLines: []string{"ledgerd " + version.Release + "+6aedb58a1b2c.dirty", "revision " + rev + " (2026-12-01T01:39:27Z, modified)"},
		},
		{
			desc:      "clean checkout, no tag in the repository",
			bi:        build("v0.0.0-20261201013927-6aedb58a1b2c", "vcs.revision", rev, "vcs.modified", "false"),
			wantShort: version.Release + "+6aedb58a1b2c",
			wantLines: []string{"ledgerd " + version.Release + "+6aedb58a1b2c", "revision " + rev},
		},
		{
			desc:      "clean checkout after a tag",
			bi:        build("v1.2.1-0.20261201013927-6aedb58a1b2c", "vcs.revision", rev, "vcs.modified", "false"),
			wantShort: version.Release + "+6aedb58a1b2c",
			wantLines: []string{"ledgerd " + version.Release + "+6aedb58a1b2c", "revision " + rev},
		},
		{
			desc:      "tagged release with changes",
			bi:        build(version.Release+"+dirty", "vcs.revision", rev, "vcs.modified", "true"),
			wantShort: version.Release + "+6aedb58a1b2c.dirty",
			wantLines: []string{"ledgerd " + version.Release + "+6aedb58a1b2c.dirty", "module github.com/effect-ledger/effect-ledger " + version.Release + "+dirty"},
		},
		{
			desc:      "no version control (-buildvcs=false)",
			bi:        build("(devel)"),
			wantShort: version.Release,
			wantLines: []string{"ledgerd " + version.Release, "module github.com/effect-ledger/effect-ledger (devel)"},
		},
		{
			desc:      "no build info",
			bi:        nil,
			wantShort: version.Release,
			wantLines: []string{"ledgerd " + version.Release},
		},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			info := version.FromBuildInfo("ledgerd", tc.bi)
			assert.Equal(t, tc.wantShort, info.Short())
			out := info.String()
			lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			for _, want := range tc.wantLines {
				assert.Contains(t, lines, want, "got:\n%s", out)
			}
			assert.Contains(t, lines, "contract v1.4 (implements v1, v1.1, v1.2, v1.3, v1.4)")
			assert.True(t, strings.HasPrefix(lines[len(lines)-1], "go go1."), "last line names the toolchain: %q", lines[len(lines)-1])

			var got version.Info
			require.NoError(t, json.Unmarshal(info.JSON(), &got))
			assert.Equal(t, info, got, "JSON round-trips")
		})
	}
}

// TestShort_devTreeLinkedRevision: scripts/release builds without VCS
// stamping and links the revision in; a -dev tree's binaries still name
// their commit, a release tree's print the release alone.
func TestShort_devTreeLinkedRevision(t *testing.T) {
	info := version.FromBuildInfo("ledgerd", build("(devel)"))
	info.Revision = rev
	assert.Equal(t, "v0.4.0-dev+6aedb58a1b2c", info.Short())
	assert.Contains(t, info.String(), "ledgerd v0.4.0-dev+6aedb58a1b2c\n")

	rel := version.FromBuildInfo("ledgerd", build("(devel)"))
	rel.Version, rel.Revision = "v0.4.0", rev
	assert.Equal(t, "v0.4.0", rel.Short(), "a release tree built by scripts/release")
}

func TestRead(t *testing.T) {
	info := version.Read("ledgerctl")
	assert.Equal(t, "ledgerctl", info.Binary)
	assert.Equal(t, version.Contract, info.Contract)
	assert.Equal(t, []string{"v1", "v1.1", "v1.2", "v1.3", "v1.4"}, info.Contracts)
	assert.NotEmpty(t, info.Short())
}

// TestRelease: the tree's release is a semantic version a tag can carry,
// or the next one with -dev between releases.
func TestRelease(t *testing.T) {
	assert.True(t, semver.IsValid(version.Release), "%q is a semantic version", version.Release)
	assert.Equal(t, version.Release, semver.Canonical(version.Release), "vMAJOR.MINOR.PATCH[-dev], nothing else")
	assert.Contains(t, []string{"", "-dev"}, semver.Prerelease(version.Release), "a release or the next one's -dev")
}

// TestRelease_taggedOrDev: a tree whose Release is a release (no -dev)
// is the commit that release's tag points at; any other commit says -dev,
// so that a build of main never names a release it is not.
func TestRelease_taggedOrDev(t *testing.T) {
	if semver.Prerelease(version.Release) == "-dev" {
		return
	}
	out, err := exec.Command("git", "tag", "--points-at", "HEAD").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	assert.Contains(t, strings.Fields(string(out)), version.Release,
		"Release is %s but HEAD carries no tag %s: set it to the next release with -dev (docs/release.md)", version.Release, version.Release)
}

// pep440 is the Python spelling of a release: 0.4.0, or 0.4.0.dev0 for
// v0.4.0-dev.
func pep440(release string) string {
	v := strings.TrimPrefix(release, "v")
	if base, ok := strings.CutSuffix(v, "-dev"); ok {
		return base + ".dev0"
	}
	return v
}

// TestRelease_clientsInStep: the TypeScript and Python clients carry the
// release's version (docs/release.md, the checklist).
func TestRelease_clientsInStep(t *testing.T) {
	want := strings.TrimPrefix(version.Release, "v")
	pkg, err := os.ReadFile("../../clients/typescript/package.json")
	require.NoError(t, err)
	var p struct{ Version string }
	require.NoError(t, json.Unmarshal(pkg, &p))
	assert.Equal(t, want, p.Version, "clients/typescript/package.json")
	lock, err := os.ReadFile("../../clients/typescript/package-lock.json")
	require.NoError(t, err)
	var l struct {
		Version  string
		Packages map[string]struct{ Version string }
	}
	require.NoError(t, json.Unmarshal(lock, &l))
	assert.Equal(t, want, l.Version, "clients/typescript/package-lock.json")
	assert.Equal(t, want, l.Packages[""].Version, "clients/typescript/package-lock.json, the root package")

	want = pep440(version.Release) // PEP 440

	py, err := os.ReadFile("../../clients/python/pyproject.toml")
	require.NoError(t, err)
	assert.Contains(t, string(py), "\nversion = \""+want+"\"\n", "clients/python/pyproject.toml")
	initPy, err := os.ReadFile("../../clients/python/src/effect_ledger/__init__.py")
	require.NoError(t, err)
	assert.Contains(t, string(initPy), "\n__version__ = \""+want+"\"\n", "effect_ledger.__version__")
}

// TestRelease_modulesInStep: the main module requires the client module at
// the release it is (the two are tagged together, docs/release.md), with no
// replace or exclude directive, which go install …@version refuses; the
// workspace (go.work) builds the client from ./client meanwhile. The npm
// package of ledger-mcp and its platform packages carry the release too.
func TestRelease_modulesInStep(t *testing.T) {
	b, err := os.ReadFile("../../go.mod")
	require.NoError(t, err)
	mf, err := modfile.Parse("go.mod", b, nil)
	require.NoError(t, err)
	assert.Empty(t, mf.Replace, "go.mod: go install …@version refuses a module with replace directives")
	assert.Empty(t, mf.Exclude, "go.mod: go install …@version refuses a module with exclude directives")
	client := ""
	for _, r := range mf.Require {
		if r.Mod.Path == "github.com/effect-ledger/effect-ledger/client" {
			client = r.Mod.Version
		}
	}
	assert.Equal(t, version.Release, client, "go.mod: the client module at the release beside it")

	want := strings.TrimPrefix(version.Release, "v")
	b, err = os.ReadFile("../../packaging/npm/ledger-mcp/package.json")
	require.NoError(t, err)
	var p struct {
		Version              string
		OptionalDependencies map[string]string
	}
	require.NoError(t, json.Unmarshal(b, &p))
	assert.Equal(t, want, p.Version, "packaging/npm/ledger-mcp/package.json")
	assert.Len(t, p.OptionalDependencies, 5)
	for name, v := range p.OptionalDependencies {
		assert.Equal(t, want, v, "packaging/npm/ledger-mcp/package.json: %s", name)
	}
}
