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

// floors ranks the module's folders: a package imports only packages of
// its own folder or of a lower floor. Utilities (internal/) and the
// receipt (chain) are the ground; the test kits (testkit/) stand beside
// the binaries, above all that they test.
var floors = map[string]int{
	"chain": 0, "client": 0, "internal": 0,
	"tlog":    1,
	"archive": 2, // segments of a chain and its tree (SPEC §16)
	"ledger":  3,
	"verify":  4, "storage": 4,
	"api": 5, "mcpgate": 5,
	"cmd": 6, "testkit": 6, "examples": 6,
	"scripts": 7, "test": 7,
}

// TestImportsRunDown keeps the layout's floors: no package of the module
// imports one on its own floor in another folder, or on a higher floor.
func TestImportsRunDown(t *testing.T) {
	const mod = "github.com/effect-ledger/effect-ledger/"
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", mod+"...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	floor := func(pkg string) (string, int) {
		dir, _, _ := strings.Cut(strings.TrimPrefix(pkg, mod), "/")
		f, ok := floors[dir]
		if !ok {
			t.Errorf("%s: folder %s has no floor", pkg, dir)
		}
		return dir, f
	}
	for line := range strings.Lines(string(out)) {
		pkgs := strings.Fields(line)
		dir, f := floor(pkgs[0])
		for _, imp := range pkgs[1:] {
			if !strings.HasPrefix(imp, mod) {
				continue
			}
			if idir, ifl := floor(imp); idir != dir && ifl >= f {
				t.Errorf("%s (floor %d) imports %s (floor %d)", pkgs[0], f, imp, ifl)
			}
		}
	}
}
