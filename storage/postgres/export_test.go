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

// ListenerPID waits until s's LISTEN connection is in place and returns
// its backend pid.
func ListenerPID(s *Store, timeout time.Duration) (uint32, bool) {
	s.mu.Lock()
	l := s.listen
	s.mu.Unlock()
	if l == nil {
		return 0, false
	}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		l.mu.Lock()
		pid := l.pid
		l.mu.Unlock()
		if pid != 0 {
			return pid, true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return 0, false
}
