//go:build integration

// Package release_test checks scripts/release: its binaries name their
// release and revision without VCS stamping, and two builds of one commit
// are byte-identical even from another directory with a cold build cache.
// It compiles everything twice (minutes), so it is an integration test:
//
//	go test -tags integration ./test/release
package release_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/internal/version"
)

// rev is the revision both builds link in; any 40 hex digits would do.
const rev = "0123456789abcdef0123456789abcdef01234567"

// root returns the repository's root directory.
func root(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	return dir
}

// copyTree copies the files git knows of (tracked, and untracked but not
// ignored) from src to a new directory, so that a second build sees the
// same sources at another path.
func copyTree(t *testing.T, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "src")
	ls := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	ls.Dir = src
	out, err := ls.Output()
	require.NoError(t, err, "git ls-files")
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		fi, err := os.Lstat(filepath.Join(src, name))
		if os.IsNotExist(err) {
			continue // deleted in the working tree
		}
		require.NoError(t, err)
		b, err := os.ReadFile(filepath.Join(src, name))
		require.NoError(t, err)
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dst, name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dst, name), b, fi.Mode().Perm()))
	}
	return dst
}

// release runs scripts/release in tree with args into a new folder and
// returns it.
func release(t *testing.T, tree string, args ...string) string {
	return releaseEnv(t, tree, nil, args...)
}

// releaseEnv is release with env added to the environment.
func releaseEnv(t *testing.T, tree string, env []string, args ...string) string {
	t.Helper()
	out := t.TempDir()
	cmd := exec.Command("bash", append([]string{filepath.Join(tree, "scripts", "release"), "-o", out}, args...)...)
	cmd.Dir = tree
	cmd.Env = append(os.Environ(), append([]string{"REVISION=" + rev, "MODIFIED=false"}, env...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Run(), "scripts/release:\n%s", stderr.String())
	return out
}

// TestRelease_reproducible builds the release twice, the second time
// from a copy of the tree at another path with an empty build cache, and
// compares every byte.
func TestRelease_reproducible(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries twice from scratch")
	}
	if runtime.GOOS != "linux" {
		t.Skip("scripts/release builds Linux binaries")
	}
	src := root(t)
	// The host's architecture, with cgo and in pure Go.
	args := []string{"-a", runtime.GOARCH, "-t", "linux/" + runtime.GOARCH}
	first := release(t, src, args...)
	second := releaseEnv(t, copyTree(t, src), []string{"GOCACHE=" + t.TempDir()}, args...)

	sums1, err := os.ReadFile(filepath.Join(first, "SHA256SUMS"))
	require.NoError(t, err)
	sums2, err := os.ReadFile(filepath.Join(second, "SHA256SUMS"))
	require.NoError(t, err)
	assert.Equal(t, string(sums1), string(sums2), "SHA256SUMS of the two builds")

	names := strings.Fields(string(sums1))
	var bins []string
	for i := 1; i < len(names); i += 2 {
		bins = append(bins, names[i])
	}
	for _, cmd := range commands {
		assert.Contains(t, bins, cmd+"_"+version.Release+"_linux_"+runtime.GOARCH)
		assert.Contains(t, bins, cmd+"_"+version.Release+"_linux_"+runtime.GOARCH+"_static")
	}
	for _, bin := range bins {
		b1, err := os.ReadFile(filepath.Join(first, bin))
		require.NoError(t, err)
		b2, err := os.ReadFile(filepath.Join(second, bin))
		require.NoError(t, err)
		assert.True(t, bytes.Equal(b1, b2), "%s differs between the two builds", bin)
	}

	check := exec.Command("sha256sum", "-c", "SHA256SUMS")
	check.Dir = first
	outp, err := check.CombinedOutput()
	assert.NoError(t, err, "sha256sum -c:\n%s", outp)

	t.Run("VersionWithoutVCS", func(t *testing.T) {
		for _, bin := range bins {
			cmd := strings.SplitN(bin, "_", 2)[0]
			out, err := exec.Command(filepath.Join(first, bin), "--version").Output()
			require.NoError(t, err, cmd)
			lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
			want := cmd + " " + version.Release
			if strings.HasSuffix(version.Release, "-dev") {
				want += "+" + rev[:12] // a -dev tree names its commit
			}
			assert.Equal(t, want, lines[0], "the release, not (devel):\n%s", out)
			assert.Contains(t, lines, "revision "+rev, "the linked-in revision:\n%s", out)
		}
	})
}
