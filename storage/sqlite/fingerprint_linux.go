package sqlite

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
)

// fingerprint identifies the state of the SQLite file at path and of its
// write-ahead log: device, inode, size, modification and change times
// (nanoseconds); "" when it cannot be read (seal.go).
func fingerprint(path string) string {
	var b strings.Builder
	for _, p := range []string{path, path + "-wal"} {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			if errors.Is(err, syscall.ENOENT) && p != path {
				b.WriteString("-;")
				continue
			}
			return ""
		}
		fmt.Fprintf(&b, "%d:%d:%d:%d.%d:%d.%d;", st.Dev, st.Ino, st.Size,
			st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec)
	}
	return b.String()
}
