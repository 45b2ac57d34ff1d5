// Package glob matches tool names against the globs of a policy (SPEC §11,
// §13): `*` matches any bytes, `/` and `.` included, `?` matches one
// byte, `[…]` one byte of a class (`[!…]` or `[^…]` negated), and `\`
// makes the next byte literal. Unlike path.Match, no byte is special to
// `*`, so a rule for "*" covers an upstream's "admin/delete" too.
package glob

import (
	"fmt"
	"regexp"
	"strings"
)

// Glob is a compiled pattern.
type Glob struct {
	pattern string
	re      *regexp.Regexp
}

// Compile checks and compiles a pattern: an empty pattern, an unclosed
// class and a trailing `\` are errors.
func Compile(pattern string) (*Glob, error) {
	if pattern == "" {
		return nil, fmt.Errorf("glob: empty pattern")
	}
	var b strings.Builder
	b.WriteString(`(?s)\A`)
	for i := 0; i < len(pattern); i++ {
		switch c := pattern[i]; c {
		case '*':
			b.WriteString(`.*`)
		case '?':
			b.WriteString(`.`)
		case '\\':
			if i+1 == len(pattern) {
				return nil, fmt.Errorf("glob %q: a trailing \\ escapes nothing", pattern)
			}
			i++
			b.WriteString(regexp.QuoteMeta(pattern[i : i+1]))
		case '[':
			end, class, err := classAt(pattern, i)
			if err != nil {
				return nil, err
			}
			b.WriteString(class)
			i = end
		default:
			b.WriteString(regexp.QuoteMeta(pattern[i : i+1]))
		}
	}
	b.WriteString(`\z`)
	re, err := regexp.Compile(b.String())
	if err != nil {
		return nil, fmt.Errorf("glob %q: %w", pattern, err)
	}
	return &Glob{pattern: pattern, re: re}, nil
}

// classAt translates the class that opens at pattern[i] == '[' and
// returns the index of its closing ']'.
func classAt(pattern string, i int) (int, string, error) {
	var b strings.Builder
	b.WriteByte('[')
	j := i + 1
	if j < len(pattern) && (pattern[j] == '!' || pattern[j] == '^') {
		b.WriteByte('^')
		j++
	}
	start := j
	for ; j < len(pattern); j++ {
		c := pattern[j]
		switch {
		case c == ']' && j > start:
			b.WriteByte(']')
			return j, b.String(), nil
		case c == '\\':
			if j+1 == len(pattern) {
				return 0, "", fmt.Errorf("glob %q: a trailing \\ escapes nothing", pattern)
			}
			j++
			b.WriteString(regexp.QuoteMeta(pattern[j : j+1]))
		case c == '-' && j > start && j+1 < len(pattern) && pattern[j+1] != ']':
			b.WriteByte('-')
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	return 0, "", fmt.Errorf("glob %q: a class opened at byte %d is not closed", pattern, i+1)
}

// Match reports whether name matches the whole pattern.
func (g *Glob) Match(name string) bool { return g.re.MatchString(name) }

// String is the pattern.
func (g *Glob) String() string { return g.pattern }
