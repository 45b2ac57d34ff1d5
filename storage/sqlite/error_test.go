//go:build cgo && !modernc

package sqlite_test

import (
	"errors"
	"testing"

	"github.com/mattn/go-sqlite3"
	"github.com/stretchr/testify/assert"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
)

// TestClassify checks that every "cannot write now" condition of SQLite
// becomes ErrUnavailable (503 + Retry-After), by error code, and that
// other errors stay internal.
func TestClassify(t *testing.T) {
	for _, tt := range []struct {
		desc string
		code sqlite3.ErrNo
		want error
	}{
		{"busy", sqlite3.ErrBusy, ledger.ErrBusy},
		{"locked", sqlite3.ErrLocked, ledger.ErrBusy},
		{"read-only filesystem or file", sqlite3.ErrReadonly, ledger.ErrReadOnly},
		{"disk full", sqlite3.ErrFull, ledger.ErrDiskFull},
		{"I/O error", sqlite3.ErrIoErr, ledger.ErrIO},
		{"cannot open", sqlite3.ErrCantOpen, ledger.ErrIO},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			err := sqlite.Classify(sqlite3.Error{Code: tt.code})
			assert.ErrorIs(t, err, tt.want)
			assert.ErrorIs(t, err, ledger.ErrUnavailable)
			assert.Equal(t, ledger.ECodeUnavailable, ledger.ErrorCode(err))
			var se sqlite3.Error
			assert.True(t, errors.As(err, &se), "the driver error stays reachable")
		})
	}
	for _, code := range []sqlite3.ErrNo{sqlite3.ErrCorrupt, sqlite3.ErrNotADB} {
		t.Run("corrupt "+code.Error(), func(t *testing.T) {
			err := sqlite.Classify(sqlite3.Error{Code: code})
			assert.ErrorIs(t, err, ledger.ErrStorageCorrupt)
			assert.Equal(t, ledger.ECodeStorageCorrupt, ledger.ErrorCode(err))
		})
	}
	t.Run("constraint is internal", func(t *testing.T) {
		err := sqlite.Classify(sqlite3.Error{Code: sqlite3.ErrConstraint})
		assert.NotErrorIs(t, err, ledger.ErrUnavailable)
		assert.Equal(t, ledger.ECodeInternal, ledger.ErrorCode(err))
		assert.Equal(t, "internal error", ledger.ErrorMessage(err))
	})
}
