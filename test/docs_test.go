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
