//go:build cgo && !modernc

package sqlite

import (
	"database/sql"
	"errors"
	"fmt"
	"sync"

	"github.com/mattn/go-sqlite3"
)

// The default driver: mattn/go-sqlite3, SQLite compiled with cgo. Its
// pure-Go alternative is driver_modernc.go (build tag modernc, or any
// build without cgo).

var registerWriter sync.Once

func writerDriverName() string {
	registerWriter.Do(func() {
		sql.Register(writerDriver, &sqlite3.SQLiteDriver{ConnectHook: func(c *sqlite3.SQLiteConn) error {
			for _, p := range writerPragmas {
				if _, err := c.Exec(p, nil); err != nil {
					return fmt.Errorf("%s: %w", p, err)
				}
			}
			return nil
		}})
	})
	return writerDriver
}

// sqliteCode returns the primary result code of an SQLite error in err.
func sqliteCode(err error) (int, bool) {
	var se sqlite3.Error
	if !errors.As(err, &se) {
		return 0, false
	}
	return int(se.Code), true
}

// withBackup starts SQLite's online backup of src's database into dst's
// and calls fn with it (the connections are the driver's only inside it).
func withBackup(src, dst *sql.Conn, _ string, fn func(pageCopier) error) error {
	return src.Raw(func(s any) error {
		return dst.Raw(func(d any) error {
			sc, ok1 := s.(*sqlite3.SQLiteConn)
			dc, ok2 := d.(*sqlite3.SQLiteConn)
			if !ok1 || !ok2 {
				return errors.New("not an SQLite connection")
			}
			b, err := dc.Backup("main", sc, "main")
			if err != nil {
				return fmt.Errorf("start: %w", err)
			}
			return fn(b)
		})
	})
}
