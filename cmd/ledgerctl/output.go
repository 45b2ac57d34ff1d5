package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
)

// Helpers that every command uses to print: JSON, counts, short hashes
// and table cells, times.

// writeJSON prints v as compact JSON without HTML escaping, so that
// embedded results keep their stored bytes.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// plural returns "1 receipt" or "2 receipts": n and the noun in the
// right number.
func plural[N ~int | ~int64 | ~uint64](n N, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// short abbreviates a hash for tables.
func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

// cell makes a string safe for one table cell, abbreviating it past 60
// bytes.
func cell(s string) string {
	s = keyCell(s)
	if len(s) > 60 {
		return s[:57] + "…"
	}
	return s
}

// keyCell makes an idempotency key safe for one table cell and keeps it
// whole (up to 255 bytes), so that it can be copied into `ledgerctl show`
// or `resolve`: control characters, which no ledger accepts in a key,
// print as "·".
func keyCell(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '·'
		}
		return r
	}, s)
	if s == "" {
		return "-"
	}
	return s
}

// ms formats unix milliseconds as an RFC 3339 UTC time.
func ms(v uint64) string { return time.UnixMilli(int64(v)).UTC().Format(time.RFC3339) }
