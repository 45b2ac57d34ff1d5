package api

import "net/http"

// StatusOf exposes the code→status table to the tests.
func StatusOf(code string) int {
	if s, ok := statusOf[code]; ok && code != "internal" {
		return s
	}
	if code == "internal" {
		return 0
	}
	return 500
}

// AddPanicRoute adds a route whose handler panics, to test recovery.
func (s *Server) AddPanicRoute() {
	s.router.HandleFunc("/test/panic", func(http.ResponseWriter, *http.Request) { panic("boom") })
}

// AddHoldRoute adds a route whose handler holds its request in flight
// until release is closed, to test the in-flight bounds.
func (s *Server) AddHoldRoute(release <-chan struct{}) {
	s.router.HandleFunc("/test/hold", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
}
