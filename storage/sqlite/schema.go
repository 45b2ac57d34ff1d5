package sqlite

import (
	_ "embed"
	"strings"
)

// schemaSQL is schema.sql, the SQLite schema of a ledger file (the
// repository's top-level schema.sql links to it).
//
//go:embed schema.sql
var schemaSQL string

// SchemaVersion is the user_version that schema.sql stamps.
const SchemaVersion = 6

// schemaStatements returns the statements of schema.sql that create the
// named objects ("TABLE settings", "TRIGGER settings_fixed"), so that a
// migration adds them exactly as a new file has them. A table's statement
// ends with ");" and a trigger's with "END;", each at the start of a line;
// a name schema.sql does not create panics at start-up.
func schemaStatements(objects ...string) string {
	var b strings.Builder
	for _, o := range objects {
		start := strings.Index(schemaSQL, "\nCREATE "+o+" ")
		if start < 0 {
			panic("schema.sql creates no " + o)
		}
		end := "\n);"
		switch {
		case strings.HasPrefix(o, "TRIGGER "):
			end = "\nEND;"
		case strings.HasPrefix(o, "INDEX "):
			end = ";"
		}
		n := strings.Index(schemaSQL[start:], end)
		if n < 0 {
			panic("schema.sql: no end to " + o)
		}
		b.WriteString(schemaSQL[start : start+n+len(end)])
		b.WriteString("\n")
	}
	return b.String()
}
