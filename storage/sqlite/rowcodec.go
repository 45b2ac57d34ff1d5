package sqlite

import (
	"encoding/hex"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/effect-ledger/effect-ledger/chain"
)

// SQLite is dynamically typed: a file edited outside the ledger (or
// written by a buggy writer) can hold text in an INTEGER column, a
// negative number, a REAL, a hash of the wrong size. Reads never fail on
// such a row: the field keeps its zero value and is listed in the
// receipt's Malformed, so that the API still answers valid JSON and the
// verifier reports the field (rule invalid_field) and keeps going.

// receiptColumnNames are the names of receiptColumns, in order.
var receiptColumnNames = [...]string{"seq", "kind", "idempotency_key", "key_generated",
	"execution_id", "attempt", "tool", "effect", "idempotent", "input_hash", "outcome",
	"external_ref", "result", "error_code", "error_message", "retryable", "lease_expires_at",
	"ref_seq", "actor", "note", "recorded_at", "prev_hash", "hash"}

// receiptFields returns pointers to the fields of r in receiptColumns
// order: *uint64, *string, *bool or *chain.Hash.
func receiptFields(r *chain.Receipt) [len(receiptColumnNames)]any {
	return [...]any{&r.Seq, &r.Kind, &r.IdempotencyKey, &r.KeyGenerated, &r.ExecutionID,
		&r.Attempt, &r.Tool, &r.Effect, &r.Idempotent, &r.InputHash, &r.Outcome, &r.ExternalRef,
		&r.Result, &r.ErrorCode, &r.ErrorMessage, &r.Retryable, &r.LeaseExpiresAt, &r.RefSeq,
		&r.Actor, &r.Note, &r.RecordedAt, &r.PrevHash, &r.Hash}
}

// scanReceipt reads the columns of receiptColumns, tolerating values the
// receipt format cannot carry (see receiptFromValues).
func scanReceipt(s rowScanner) (chain.Receipt, error) {
	var vals [len(receiptColumnNames)]any
	var ptrs [len(receiptColumnNames)]any
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if err := s.Scan(ptrs[:]...); err != nil {
		return chain.Receipt{}, err
	}
	return receiptFromValues(vals[:]), nil
}

// receiptFromValues builds a receipt from the values of receiptColumns as
// the driver returns them (int64, float64, string, []byte or nil; V is
// any or driver.Value). A
// value of the wrong type or range leaves its field zero and is listed in
// Malformed: integers must be int64 ≥ 0, booleans 0 or 1, hashes 32
// bytes, strings not NULL (a number in a text column reads as its text,
// as SQLite itself converts it). []byte values are copied.
func receiptFromValues[V any](vals []V) chain.Receipt {
	var r chain.Receipt
	for i, p := range receiptFields(&r) {
		v := any(vals[i])
		ok := true
		switch p := p.(type) {
		case *uint64:
			n, isInt := v.(int64)
			if ok = isInt && n >= 0; ok {
				*p = uint64(n)
			}
		case *bool:
			n, isInt := v.(int64)
			if ok = isInt && (n == 0 || n == 1); ok {
				*p = n == 1
			}
		case *string:
			switch x := v.(type) {
			case string:
				*p = x
			case []byte:
				*p = string(x)
			case int64:
				*p = strconv.FormatInt(x, 10)
			case float64:
				*p = realText(x)
			default:
				ok = false
			}
		case *chain.Hash:
			var b []byte
			switch x := v.(type) {
			case []byte:
				b = x
			case string:
				b = []byte(x)
			}
			if ok = len(b) == chain.HashSize; ok {
				copy(p[:], b)
			}
		}
		if !ok {
			r.Malformed = append(r.Malformed, chain.Malformed{Field: receiptColumnNames[i], Value: sqlLiteral(v)})
		}
	}
	return r
}

// printable writes control characters, DEL and bytes that are not UTF-8
// as \xNN, so that a quoted value cannot drive a terminal.
func printable(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size <= 1 || r < 0x20 || r == 0x7f || r >= 0x80 && r < 0xa0 {
			fmt.Fprintf(&b, "\\x%02x", s[i])
			i++
			continue
		}
		b.WriteString(s[i : i+size])
		i += size
	}
	return b.String()
}

// realText writes a REAL the way SQLite converts it to text: the shortest
// decimal that round-trips, with ".0" when it has no fraction, and an
// exponent outside 1e-4 … 1e15.
func realText(x float64) string {
	if a := math.Abs(x); a == 0 || a >= 1e-4 && a < 1e15 {
		s := strconv.FormatFloat(x, 'f', -1, 64)
		if !strings.ContainsAny(s, ".NI") {
			s += ".0"
		}
		return s
	}
	s := strconv.FormatFloat(x, 'e', -1, 64)
	if m, e, ok := strings.Cut(s, "e"); ok && !strings.Contains(m, ".") {
		s = m + ".0e" + e
	}
	return s
}

// maxLiteral bounds the bytes of a value quoted in Malformed.
const maxLiteral = 64

// sqlLiteral writes a driver value the way SQLite's quote() does, cut
// after maxLiteral bytes, with unprintable bytes of text as \xNN.
func sqlLiteral(v any) string {
	switch x := v.(type) {
	case nil:
		return "NULL"
	case int64:
		return strconv.FormatInt(x, 10)
	case float64:
		return realText(x)
	case string:
		cut := ""
		if len(x) > maxLiteral {
			x, cut = x[:maxLiteral], "…"
		}
		return "'" + printable(strings.ReplaceAll(x, "'", "''")) + "'" + cut
	case []byte:
		cut := ""
		if len(x) > maxLiteral/2 {
			x, cut = x[:maxLiteral/2], "…"
		}
		return "X'" + strings.ToUpper(hex.EncodeToString(x)) + "'" + cut
	default:
		return "?"
	}
}
