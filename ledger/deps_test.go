package ledger_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestNoSQLDependency keeps the domain free of SQL (drivers only
// store): package ledger must not import database/sql or the SQLite
// driver, directly or through another package. The SQL lives in storage/sqlite and
// storage/postgres.
func TestNoSQLDependency(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 || !slices.Contains(deps, "github.com/effect-ledger/effect-ledger/ledger") {
		t.Fatalf("go list -deps printed no dependency list:\n%s", out)
	}
	for _, d := range deps {
		if d == "database/sql" || d == "database/sql/driver" || strings.HasPrefix(d, "github.com/mattn/go-sqlite3") ||
			strings.HasPrefix(d, "github.com/effect-ledger/effect-ledger/storage") ||
			strings.HasPrefix(d, "github.com/jackc/") {
			t.Errorf("package ledger depends on %s", d)
		}
	}
}
