package test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// docPages are the Markdown pages whose relative links must resolve, from
// the repository's root.
var docPages = []string{"README.md", "docs/*.md", "docs/design/*.md", "clients/*/README.md"}

var (
	mdLink     = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	codeSpan   = regexp.MustCompile("`[^`]*`")
	mdHeading  = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	linkInText = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
)

// proseLines returns the lines of a Markdown page outside fenced code
// blocks, so that shell comments in a block are not read as headings.
func proseLines(text string) []string {
	var out []string
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			out = append(out, line)
		}
	}
	return out
}

// slug is the anchor GitHub gives a heading: lower case, punctuation
// other than '-' and '_' dropped, spaces turned into '-'.
func slug(heading string) string {
	heading = linkInText.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the anchors of a Markdown page's headings, a repeated
// heading numbered as GitHub numbers it (-1, -2, …).
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	seen := map[string]int{}
	out := map[string]bool{}
	for _, line := range proseLines(string(raw)) {
		m := mdHeading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		s := slug(m[1])
		if n := seen[s]; n > 0 {
			out[s+"-"+strconv.Itoa(n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// TestDocs_links checks that every relative link of the README, docs/ and
// the clients' READMEs names a file of the repository, and that a link into
// a Markdown page names one of its headings.
func TestDocs_links(t *testing.T) {
	t.Parallel()
	var pages []string
	for _, pattern := range docPages {
		found, err := filepath.Glob(filepath.Join("..", pattern))
		require.NoError(t, err)
		pages = append(pages, found...)
	}
	require.GreaterOrEqual(t, len(pages), 10, "the pages are found")
	checked := 0
	for _, page := range pages {
		raw, err := os.ReadFile(page)
		require.NoError(t, err)
		for n, line := range proseLines(string(raw)) {
			line = codeSpan.ReplaceAllString(line, "")
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				file, anchor, _ := strings.Cut(target, "#")
				path := page
				if file != "" {
					path = filepath.Join(filepath.Dir(page), file)
				}
				where := page + " (prose line " + strconv.Itoa(n+1) + "): " + target
				if _, err := os.Stat(path); !assert.NoError(t, err, where) {
					continue
				}
				if anchor != "" && strings.HasSuffix(path, ".md") {
					assert.True(t, anchors(t, path)[anchor], "%s: no heading with anchor #%s", where, anchor)
				}
			}
		}
	}
	assert.Greater(t, checked, 50, "links were read")
}

// TestDocs_slug pins the anchors GitHub gives the headings the pages link to.
func TestDocs_slug(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ heading, want string }{
		{"5. Verifier", "5-verifier"},
		{"Waiting for an in-flight effect (`wait_ms`)", "waiting-for-an-in-flight-effect-wait_ms"},
		{"Deploying: systemd, Prometheus, Grafana", "deploying-systemd-prometheus-grafana"},
		{"A reserve, from the router to the COMMIT", "a-reserve-from-the-router-to-the-commit"},
		{"Building the binaries: `scripts/release`", "building-the-binaries-scriptsrelease"},
	} {
		assert.Equal(t, tc.want, slug(tc.heading), tc.heading)
	}
}

// TestDocs_mcpFlags: docs/mcp.md's flag table lists exactly the flags
// ledger-mcp --help prints, so the two cannot drift apart.
func TestDocs_mcpFlags(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(filepath.Join(binDir, "ledger-mcp"), "--help")
	var help bytes.Buffer
	cmd.Stderr, cmd.Stdout = &help, &help
	require.NoError(t, cmd.Run())
	fromHelp := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z-]+)`).FindAllStringSubmatch(help.String(), -1) {
		if m[1] != "version" && m[1] != "help" {
			fromHelp[m[1]] = true
		}
	}
	doc, err := os.ReadFile("../docs/mcp.md")
	require.NoError(t, err)
	fromDoc := map[string]bool{}
	for line := range strings.Lines(string(doc)) {
		if !strings.HasPrefix(line, "| `--") {
			continue
		}
		first := strings.SplitN(line, "|", 3)[1]
		for _, m := range regexp.MustCompile("`--([a-z-]+)").FindAllStringSubmatch(first, -1) {
			fromDoc[m[1]] = true
		}
	}
	require.NotEmpty(t, fromHelp)
	assert.Equal(t, fromHelp, fromDoc, "flags of ledger-mcp --help (left) against docs/mcp.md's table (right)")
}

// TestDocs_namespaceListSample: the `ledgerctl namespace list` sample of
// docs/api.md is what the binary prints after the commands above it
// (hashes aside, which depend on the time).
func TestDocs_namespaceListSample(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../docs/api.md")
	require.NoError(t, err)
	const cmd = "ledgerctl namespace list --db /var/lib/ledger/ledger.db\n"
	_, after, ok := strings.Cut(string(raw), cmd)
	require.True(t, ok, "docs/api.md shows %q", cmd)
	var want []string
	for _, line := range strings.Split(after, "\n") {
		s, ok := strings.CutPrefix(line, "# ")
		if !ok {
			break
		}
		want = append(want, s)
	}
	require.NotEmpty(t, want, "the sample follows the command")

	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	l := StartLedgerd(t, db)
	for _, args := range [][]string{
		{"namespace", "create", "--db", db, "payments"},
		{"namespace", "create", "--db", db, "reports", "--key-ttl", "24h"},
	} {
		_, stderr, code := ledgerctl(t, args...)
		require.Equal(t, 0, code, "%v: %s", args, stderr)
	}
	require.Eventually(t, func() bool {
		r := l.Do("POST", "/v1/ns/payments/effects/reserve", `{"idempotency_key":"refund-order-1234","execution_id":"exec-1","tool":"payments.refund","effect":"write"}`)
		return r.Status == 201
	}, 10*time.Second, 20*time.Millisecond, "ledgerd serves the new namespace")
	out, stderr, code := ledgerctl(t, "namespace", "list", "--db", db)
	require.Equal(t, 0, code, stderr)

	hash := regexp.MustCompile(`\b[0-9a-f]{64}\b`)
	norm := func(lines []string) []string {
		out := make([]string, len(lines))
		for i, s := range lines {
			out[i] = strings.TrimRight(hash.ReplaceAllString(s, strings.Repeat("h", 64)), " ")
		}
		return out
	}
	got := strings.Split(strings.TrimSuffix(strings.ReplaceAll(out, dir, "/var/lib/ledger"), "\n"), "\n")
	assert.Equal(t, norm(want), norm(got), "docs/api.md's sample; the binary printed:\n%s", out)
}

// TestDocs_installsOnlyTaggedVersions: the README and docs/ tell a reader
// to clone, go get or download only versions the repository carries a
// tag for (`--branch vX.Y.Z`, `…@vX.Y.Z`, `NAME_vX.Y.Z_linux_ARCH`).
func TestDocs_installsOnlyTaggedVersions(t *testing.T) {
	out, err := exec.Command("git", "tag").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	tags := map[string]bool{}
	for _, tag := range strings.Fields(string(out)) {
		tags[tag] = true
	}
	// "@vX.Y.Z" only of this repository's own modules: a dependency's
	// version (go-sdk@v1.8.0) is not ours to tag.
	ref := regexp.MustCompile(`(?:--branch |effect-ledger[\w./\-]*@|_)(v\d+\.\d+\.\d+)(?:_linux|[^\w.\-]|$)`) // not vX.Y.Z-dev
	var pages []string
	for _, glob := range docPages {
		m, err := filepath.Glob(filepath.Join("..", glob))
		require.NoError(t, err)
		pages = append(pages, m...)
	}
	for _, page := range pages {
		raw, err := os.ReadFile(page)
		require.NoError(t, err)
		for i, line := range strings.Split(string(raw), "\n") {
			for _, m := range ref.FindAllStringSubmatch(line, -1) {
				if !tags[m[1]] && !tags["client/"+m[1]] {
					t.Errorf("%s:%d points at %s, which no tag of the repository carries: %s", page, i+1, m[1], strings.TrimSpace(line))
				}
			}
		}
	}
}
