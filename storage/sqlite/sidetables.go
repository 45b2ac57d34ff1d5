package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
)

// sideTables are the tables schema 8 gained after files of it were made:
// the subject index, the pending erasure marks and the erased subjects
// (SPEC §14), the tokens of reconciled reservations (§15). None is part of the chain, and a file
// without them is otherwise of this schema: a writer that opens such a
// file makes the ones it lacks, as schema.sql makes them (addSideTables).
var sideTables = []string{"ns_subjects", "ns_pending_erasures", "ns_reconciled_tokens", "ns_erasure_subjects"}

// addSideTables makes, in tx, each side table the file lacks, with its
// indexes, and reports whether it made one.
func addSideTables(ctx context.Context, tx *sql.Tx) (bool, error) {
	added := false
	for _, table := range sideTables {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = ?`,
			table).Scan(&n); err != nil {
			return false, fmt.Errorf("side table %s: %w", table, classify(err))
		}
		if n > 0 {
			continue
		}
		ddl := schemaOf(table)
		if ddl == "" {
			return false, fmt.Errorf("side table %s: not in schema.sql", table)
		}
		if _, err := tx.ExecContext(ctx, ddl); err != nil {
			return false, fmt.Errorf("side table %s: %w", table, classify(err))
		}
		added = true
	}
	return added, nil
}

// schemaOf returns the statements of schema.sql that make table, its
// indexes and its triggers, as schema.sql writes them.
func schemaOf(table string) string {
	var b strings.Builder
	for _, st := range strings.Split(schemaSQL, ";\n") {
		st = withoutComments(st)
		head, _, _ := strings.Cut(st, "\n")
		if strings.HasPrefix(st, "CREATE TABLE "+table+" (") ||
			strings.HasPrefix(head, "CREATE INDEX ") && strings.Contains(head, " ON "+table+" (") ||
			strings.HasPrefix(head, "CREATE TRIGGER ") && strings.HasSuffix(head, " ON "+table) {
			b.WriteString(st + ";\n")
		}
	}
	return b.String()
}

// withoutComments drops the blank and comment lines before a statement.
func withoutComments(st string) string {
	for {
		st = strings.TrimLeft(st, " \t\n")
		if !strings.HasPrefix(st, "--") {
			return st
		}
		_, rest, ok := strings.Cut(st, "\n")
		if !ok {
			return ""
		}
		st = rest
	}
}
