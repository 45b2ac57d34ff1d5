// Package verify audits an effect ledger: chain integrity and the key
// state machine (SPEC §5).
package verify
