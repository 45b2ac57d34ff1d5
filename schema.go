// Package ledgerschema embeds schema.sql, the SQLite schema of the ledger,
// so that the ledger package can apply it (go:embed cannot reach a parent
// directory).
package ledgerschema

import _ "embed"

// SQL is the content of schema.sql.
//
//go:embed schema.sql
var SQL string

// Version is the user_version that schema.sql stamps.
const Version = 2
