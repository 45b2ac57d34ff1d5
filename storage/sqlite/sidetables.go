package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
)

// sideTables are the tables schema 8 gained after files of it were made:
// the subject index, the pending erasure marks and the erased subjects
// (SPEC §14), the tokens of reconciled reservations (§15), the prunes and
// what they keep (§16). None is part of the chain, and a file without
// them is otherwise of this schema: a writer that opens such a file makes
// the ones it lacks, as schema.sql makes them (addSideTables), and
// replaces the triggers schema.sql has since changed (sideTriggers).
var sideTables = []string{"ns_subjects", "ns_pending_erasures", "ns_reconciled_tokens", "ns_erasure_subjects",
	"ns_prunes", "ns_kept", "ns_pruned_keys", "ns_kept_receipts"}

// sideTriggers are the triggers of schema 8 changed since files of it
// were made: a receipt may go once pruned, a checkpoint once thinned
// (§16).
var sideTriggers = []string{"ns_receipts_no_delete", "ns_checkpoints_no_delete"}

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
	for _, name := range sideTriggers {
		var have string
		err := tx.QueryRowContext(ctx, `SELECT sql FROM sqlite_schema WHERE type = 'trigger' AND name = ?`, name).Scan(&have)
		if errors.Is(err, sql.ErrNoRows) {
			continue // removed by hand: the verifier's to report, not the open's to mend
		}
		if err != nil {
			return false, fmt.Errorf("trigger %s: %w", name, classify(err))
		}
		want := triggerOf(name)
		if want == "" {
			return false, fmt.Errorf("trigger %s: not in schema.sql", name)
		}
		if have == want {
			continue
		}
		if _, err := tx.ExecContext(ctx, `DROP TRIGGER `+name+`;`+want); err != nil {
			return false, fmt.Errorf("trigger %s: %w", name, classify(err))
		}
		added = true
	}
	return added, nil
}

// triggerOf returns the statement of schema.sql that makes trigger name,
// as sqlite_schema keeps it (without the final semicolon).
func triggerOf(name string) string {
	for _, st := range strings.Split(schemaSQL, ";\n") {
		if st = withoutComments(st); strings.HasPrefix(st, "CREATE TRIGGER "+name+" ") {
			return st
		}
	}
	return ""
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
