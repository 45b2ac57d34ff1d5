package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// Seals: at a clean stop, after every namespace file is closed, a writing
// Store records in the ledger file each namespace's head, key lifetime and
// the fingerprint of its file (fingerprint: device, inode, size, and the
// modification and change times of the file and of its write-ahead log).
// The next start trusts a seal instead of opening the file when the
// fingerprint is unchanged and the registry recorded the same head:
// start-up then costs a stat per namespace, not an open and a few reads
// (10,000 namespaces: issue 31). Any write to a file, a file put back from
// a backup, or a copy changes its change time or inode, so such a file is
// opened and checked as before; a ledgerd killed before its clean stop
// leaves the seals of the last one, which still match every file it did
// not write.

const (
	sqlSealsSchema = `CREATE TABLE IF NOT EXISTS namespace_seals (
	name        TEXT    PRIMARY KEY,
	fingerprint TEXT    NOT NULL,
	head_seq    INTEGER NOT NULL,
	head_hash   BLOB    NOT NULL,
	key_ttl_ms  INTEGER NOT NULL
) WITHOUT ROWID`
	sqlSealRows   = `SELECT name, fingerprint, head_seq, head_hash, key_ttl_ms FROM namespace_seals`
	sqlSealsClear = `DELETE FROM namespace_seals`
	sqlSeal       = `INSERT INTO namespace_seals (name, fingerprint, head_seq, head_hash, key_ttl_ms) VALUES (?, ?, ?, ?, ?)`
)

// readSeals reads the seals, each namespace's state as sealed at the
// last clean stop (nsState.fp: its file's fingerprint then); a ledger file without them (made before
// them, or opened read-only before any ledgerd of this version stopped
// cleanly) has none.
func readSeals(ctx context.Context, db *sql.DB) map[string]nsState {
	rows, err := db.QueryContext(ctx, sqlSealRows)
	if err != nil {
		return nil
	}
	defer func() { _ = rows.Close() }()
	out := map[string]nsState{}
	for rows.Next() {
		var name, fp string
		var seq, ttl uint64
		var hash []byte
		if rows.Scan(&name, &fp, &seq, &hash, &ttl) != nil {
			return nil
		}
		h, err := chain.HashFromBytes(hash)
		if err != nil {
			continue
		}
		out[name] = nsState{head: ledger.Head{Seq: seq, Hash: h}, ttl: ttl, fp: fp}
	}
	if rows.Err() != nil {
		return nil
	}
	return out
}

// sealed returns the sealed state of namespace ns, whose file is at path
// and whose head the registry recorded as rec, if the seal still holds.
func sealed(seals map[string]nsState, ns, path string, rec ledger.Head) (nsState, bool) {
	st, ok := seals[ns]
	if !ok || st.head != rec || st.fp == "" {
		return nsState{}, false
	}
	return st, fingerprint(path) == st.fp
}

// sealNamespaces writes the seals of a clean stop: s.mu is held and every
// namespace file is closed. A namespace whose exact head or key lifetime
// this Store does not know is left unsealed (its file is checked at the
// next start).
func (s *Store) sealNamespaces(ctx context.Context) error {
	regs, err := readRegistry(ctx, s.main.w)
	if err != nil {
		return err
	}
	tx, err := s.main.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("seal namespaces: %w", classify(err))
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, sqlSealsClear); err != nil {
		return fmt.Errorf("seal namespaces: %w", classify(err))
	}
	for _, r := range regs {
		head, want := s.recorded[r.name], s.fps[r.name]
		ttl, known := s.ttls[r.name]
		if f, ok := s.chains[r.name].(*nsFile); ok {
			f.mu <- struct{}{}
			fh, fp, open := f.head, f.fp, f.fc != nil
			if f.ttlKnown {
				ttl, known = f.ttl, true
			}
			f.mu.unlock()
			if open {
				continue
			}
			// the head the file was closed at, or the start's: exact while
			// the file keeps the fingerprint it had then
			head, want = fh, fp
		}
		if !known || head != r.head {
			continue // the registry lags: checked at the next start
		}
		fp := fingerprint(NamespacePath(s.path, r.name))
		if fp == "" || fp != want {
			continue // changed since its head was taken: checked at the next start
		}
		if _, err := tx.ExecContext(ctx, sqlSeal, r.name, fp, head.Seq, head.Hash[:], ttl); err != nil {
			return fmt.Errorf("seal namespaces: %w", classify(err))
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("seal namespaces: %w", classify(err))
	}
	return nil
}
