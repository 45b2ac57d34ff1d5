package policy

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// The ledger's names for an upstream's tools, which a rule's glob
// matches beside the upstream's own names.

// ToolNamePart makes a server name usable in the ledger's tool names and
// in a file name: anything but ASCII letters, digits, '.', '_' and '-'
// becomes '_'; an empty name is "mcp".
func ToolNamePart(name string) string {
	if name == "" {
		return "mcp"
	}
	b := []byte(name)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			b[i] = '_'
		}
	}
	if len(b) > 64 {
		b = b[:64]
	}
	return string(b)
}

// LedgerToolName is the ledger's tool name for an upstream's tool:
// <server-name>.<tool> when the ledger can hold it (1–128 bytes of
// visible ASCII, SPEC §4). A longer name, or one with other bytes (MCP
// allows tool names of 128 characters, so <server-name>.<tool> may reach
// 193 bytes), maps to its printable prefix, "~" and 16 hex digits of the
// SHA-256 of the tool's exact name: one tool, one ledger name, and given
// the upstream's tools/list the tool a ledger name stands for is found by
// mapping each name again.
func LedgerToolName(serverName, tool string) string {
	name := serverName + "." + tool
	if len(name) <= ledger.MaxIDLen && printable(name) {
		return name
	}
	sum := sha256.Sum256([]byte(tool))
	suffix := "~" + hex.EncodeToString(sum[:8])
	b := []byte(name)
	for i, c := range b {
		if c < 0x21 || c > 0x7E {
			b[i] = '_'
		}
	}
	if keep := ledger.MaxIDLen - len(suffix); len(b) > keep {
		b = b[:keep]
	}
	return string(b) + suffix
}

// printable reports whether s is made of visible ASCII (0x21–0x7E).
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7E {
			return false
		}
	}
	return true
}
