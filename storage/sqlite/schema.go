package sqlite

import _ "embed"

// schemaSQL is schema.sql, the SQLite schema of a ledger file (the
// repository's top-level schema.sql links to it).
//
//go:embed schema.sql
var schemaSQL string

// SchemaVersion is the user_version that schema.sql stamps.
const SchemaVersion = 8
