package postgres

import "time"

// SetBeforeCommit makes s call fn with the writer's backend pid just
// before each COMMIT.
func SetBeforeCommit(s *Store, fn func(pid uint32)) { s.testHook.beforeCommit = fn }

// SetResolveBudget sets how long a lost COMMIT is resolved for; the
// returned function restores it.
func SetResolveBudget(d time.Duration) (restore func()) {
	old := resolveBudget
	resolveBudget = d
	return func() { resolveBudget = old }
}
