package ledger

import "database/sql"

// Pools exposes the connection pools to the black-box tests.
func (db *DB) Pools() (writer, reader *sql.DB) { return db.w, db.r }

// Unpack exposes the packed-row decoder to the fuzz test.
var Unpack = unpack
