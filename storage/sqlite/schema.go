package sqlite

import ledgerschema "github.com/effect-ledger/effect-ledger"

// schemaSQL is the repository's schema.sql, the SQLite schema of a ledger
// file.
var schemaSQL = ledgerschema.SQL

// SchemaVersion is the user_version that schema.sql stamps.
const SchemaVersion = ledgerschema.Version
