package api

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
