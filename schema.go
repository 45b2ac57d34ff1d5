// Package ledgerschema embeds schema.sql, the SQLite schema of a ledger
// file, so that the SQLite driver (storage/sqlite) can apply it (go:embed
// cannot reach a parent directory). The PostgreSQL schema lives with its
// driver (storage/postgres/schema.go).
package ledgerschema

import _ "embed"

// SQL is the content of schema.sql.
//
//go:embed schema.sql
var SQL string

// Version is the user_version that schema.sql stamps.
const Version = 5
