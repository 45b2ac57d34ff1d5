package ledger

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"github.com/gowebpki/jcs"

	"github.com/effect-ledger/effect-ledger/chain"
)

// Field limits of SPEC §1 and §4.
const (
	MinKeyLen          = 8
	MaxKeyLen          = 255
	MaxIDLen           = 128 // execution_id and tool
	MaxInputHashLen    = 128
	MaxExternalRefLen  = 512
	MaxResultLen       = 64 << 10
	MaxErrorCodeLen    = 64
	MaxErrorMessageLen = 1024
	MaxNoteLen         = 1024
	// MaxAttempt keeps attempt numbers exact in every JSON client.
	MaxAttempt = 1<<53 - 1
)

// InputHashPrefix starts every input_hash (SPEC §2, §4).
const InputHashPrefix = "sha256:"

// ValidInputHash reports whether h is "sha256:" and 64 lowercase hex
// digits: the one form of a fingerprint a reserve accepts (SPEC §4), so
// that a client's spelling (upper case, no prefix) never makes one input
// two fingerprints for the fingerprint check and the repeat guard.
func ValidInputHash(h string) bool {
	hexPart, ok := strings.CutPrefix(h, InputHashPrefix)
	if !ok || len(hexPart) != 2*sha256.Size {
		return false
	}
	for i := 0; i < len(hexPart); i++ {
		if c := hexPart[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// GeneratedKeyPrefix starts every key the ledger generates.
const GeneratedKeyPrefix = "gen_"

// reserveArgs is a validated ReserveRequest.
type reserveArgs struct {
	key        string
	generated  bool
	execution  string
	attempt    uint64
	tool       string
	effect     string
	idempotent bool
	inputHash  string // as recorded: fp, or keyed in a committed namespace (SPEC §14)
	fp         string // the sha256: fingerprint of the request ("" without one)
	keyed      string // fp's keyed form, once made ("" until then)
	leaseMS    uint64
	waitMS     uint64
	actor      string
	input      string       // the input's compact JSON when the request gave it (SPEC §13 asks keep it)
	summary    string       // approval_summary
	changed    *Changed     // SPEC §13 repeat guard
	subjects   []SubjectMAC // SPEC §14, the MACs of the request's subjects
}

// outcomeArgs is a validated outcome of a commit or resolve.
type outcomeArgs struct {
	outcome     string
	externalRef string
	result      string
	failure     FailureDetail
}

// visibleASCII reports whether s is made of bytes 0x21–0x7E only.
func visibleASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7E {
			return false
		}
	}
	return true
}

// ValidateKey checks a supplied idempotency key that is long enough to
// dedupe: 8–255 bytes of 0x21–0x7E.
func ValidateKey(key string) error {
	if len(key) > MaxKeyLen || !visibleASCII(key) {
		return &Error{Code: ECodeInvalidKey,
			Message: fmt.Sprintf("idempotency key must be %d–%d bytes of visible ASCII (0x21–0x7E)", MinKeyLen, MaxKeyLen),
			Details: map[string]any{"field": "idempotency_key"}}
	}
	return nil
}

// NewGeneratedKey returns a fresh key: "gen_" and 130 random bits.
func NewGeneratedKey() string { return GeneratedKeyPrefix + rand.Text() }

// newReservationToken returns a fresh token of 256 random bits.
func newReservationToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return reservationTokenPrefix + hex.EncodeToString(b[:])
}

// reservationTokenPrefix starts every reservation token; 64 lowercase hex
// digits (256 random bits) follow it.
const reservationTokenPrefix = "rsv_"

// checkReservationToken rejects a string that cannot be a reservation
// token of this ledger, so that a typo or a truncated paste is told apart
// from a real token that is no longer the key's latest.
func checkReservationToken(token string) error {
	hexPart, ok := strings.CutPrefix(token, reservationTokenPrefix)
	if ok && len(hexPart) == 64 && strings.Trim(hexPart, "0123456789abcdef") == "" {
		return nil
	}
	return Invalid("reservation", "reservation is not a reservation token of this ledger (malformed: expected %s and 64 lowercase hex digits, the \"reservation\" of the reserve response)", reservationTokenPrefix)
}

// tokenHash is what the ledger stores of a reservation token.
func tokenHash(token string) []byte {
	h := sha256.Sum256([]byte(token))
	return h[:]
}

// Fingerprint returns "sha256:" and the hex SHA-256 of the RFC 8785
// canonical form of the JSON value input.
func Fingerprint(input []byte) (string, error) {
	canon, err := jcs.Transform(input)
	if err != nil {
		return "", fmt.Errorf("canonicalize: %w", err)
	}
	sum := sha256.Sum256(canon)
	return InputHashPrefix + hex.EncodeToString(sum[:]), nil
}

// CheckIJSON refuses a JSON text outside I-JSON (RFC 7493): a number
// beyond the range of a double, a lone surrogate escape, a member name
// twice in one object. input meets these rules through its RFC 8785
// fingerprint; every other stored JSON value is held to the same ones.
func CheckIJSON(raw []byte) error {
	if _, err := jcs.Transform(raw); err != nil {
		return fmt.Errorf("not I-JSON: %w", err)
	}
	return nil
}

func isEffectClass(e string) bool {
	switch e {
	case chain.EffectNone, chain.EffectRead, chain.EffectWrite, chain.EffectDestructive, chain.EffectExternal:
		return true
	}
	return false
}

// isNull reports whether a raw JSON value is absent or null.
func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || string(bytes.TrimSpace(raw)) == "null"
}

func (req *ReserveRequest) validate() (reserveArgs, error) {
	a := reserveArgs{
		key: req.IdempotencyKey, execution: req.ExecutionID, tool: req.Tool, effect: req.Effect,
		idempotent: req.Idempotent, inputHash: req.InputHash, attempt: 1, leaseMS: DefaultLeaseMS,
		actor: req.Actor,
	}
	switch {
	case strings.HasPrefix(a.key, GeneratedKeyPrefix):
		// Generated keys never dedupe: a client may not send one back.
		return a, &Error{Code: ECodeInvalidKey,
			Message: "the key prefix " + GeneratedKeyPrefix + " is reserved for keys the ledger generates; choose another key",
			Details: map[string]any{"field": "idempotency_key"}}
	case len(a.key) < MinKeyLen:
		a.key, a.generated = NewGeneratedKey(), true
	default:
		if err := ValidateKey(a.key); err != nil {
			return a, err
		}
	}
	if err := checkID("execution_id", a.execution); err != nil {
		return a, err
	}
	if req.Attempt != nil {
		if *req.Attempt < 1 || *req.Attempt > MaxAttempt {
			return a, Invalid("attempt", "attempt must be an integer from 1 to %d", int64(MaxAttempt))
		}
		a.attempt = uint64(*req.Attempt)
	}
	if err := checkID("tool", a.tool); err != nil {
		return a, err
	}
	if !isEffectClass(a.effect) {
		return a, Invalid("effect", "effect must be one of none, read, write, destructive, external")
	}
	if a.inputHash != "" && !isNull(req.Input) {
		return a, Invalid("input", "give input or input_hash, not both")
	}
	if a.inputHash != "" && !ValidInputHash(a.inputHash) {
		return a, Invalid("input_hash", `input_hash must be "sha256:" and 64 lowercase hex digits (the form the ledger computes from input), so that one input has one fingerprint`)
	}
	if !isNull(req.Input) {
		fp, err := Fingerprint(req.Input)
		if err != nil {
			return a, Invalid("input", "input cannot be fingerprinted as RFC 8785 JSON: %v", err)
		}
		a.inputHash = fp
	}
	if req.LeaseMS != nil {
		if *req.LeaseMS < MinLeaseMS || *req.LeaseMS > MaxLeaseMS {
			return a, Invalid("lease_ms", "lease_ms must be from %d to %d", MinLeaseMS, MaxLeaseMS)
		}
		a.leaseMS = uint64(*req.LeaseMS)
	}
	if req.WaitMS != nil {
		if *req.WaitMS < 0 || *req.WaitMS > MaxWaitMS {
			return a, Invalid("wait_ms", "wait_ms must be from 0 to %d", MaxWaitMS)
		}
		a.waitMS = uint64(*req.WaitMS)
	}
	return a, a.gateArgs(req)
}

// gateArgs validates the members of a reserve that only the gate reads
// (SPEC §13): the input kept for an approver, the summary and changed.
func (a *reserveArgs) gateArgs(req *ReserveRequest) error {
	if len(req.ApprovalSummary) > MaxApprovalSummary {
		return Invalid("approval_summary", "approval_summary must be at most %d bytes", MaxApprovalSummary)
	}
	a.summary = req.ApprovalSummary
	if c := req.Changed; c != nil {
		for _, v := range []struct{ field, v string }{{"changed.context_hash", c.ContextHash},
			{"changed.component", c.Component}, {"changed.strategy", c.Strategy}} {
			if len(v.v) > 256 {
				return Invalid(v.field, "%s must be at most 256 bytes", v.field)
			}
		}
		a.changed = c
	}
	if !isNull(req.Input) {
		var buf bytes.Buffer
		if err := json.Compact(&buf, req.Input); err == nil && buf.Len() <= MaxAskInput {
			a.input = buf.String()
		}
	}
	return nil
}

func checkID(field, v string) error {
	if v == "" || len(v) > MaxIDLen || !visibleASCII(v) {
		return Invalid(field, "%s is required: 1–%d bytes of visible ASCII (0x21–0x7E)", field, MaxIDLen)
	}
	return nil
}

// CheckKeyPath checks a key taken from a URL path: one too short to be
// stored is unknown_key, otherwise it must be a valid key.
func CheckKeyPath(key string) error { return checkKeyPath(key) }

func checkKeyPath(key string) error {
	if len(key) < MinKeyLen {
		return &Error{Code: ECodeUnknownKey, Message: "no such idempotency key"}
	}
	return ValidateKey(key)
}

// validateOutcome checks the outcome fields shared by commit and resolve.
func validateOutcome(outcome, externalRef string, result json.RawMessage, failure *FailureDetail) (outcomeArgs, error) {
	a := outcomeArgs{outcome: outcome, externalRef: externalRef}
	switch outcome {
	case chain.OutcomeSucceeded:
		if failure != nil {
			return a, Invalid("error", "error is only allowed with outcome failed or not_applied")
		}
	case chain.OutcomeFailed, chain.OutcomeNotApplied:
		if failure == nil {
			return a, Invalid("error", "error.code is required with outcome %s", outcome)
		}
		if outcome == chain.OutcomeNotApplied && externalRef != "" {
			return a, Invalid("external_ref", "external_ref is not allowed with outcome not_applied: nothing was applied")
		}
		if !ValidErrorCode(failure.Code) {
			return a, Invalid("error.code", "error.code must be 1–%d characters of A-Z, 0-9 and _", MaxErrorCodeLen)
		}
		if !utf8.ValidString(failure.Message) || utf8.RuneCountInString(failure.Message) > MaxErrorMessageLen {
			return a, Invalid("error.message", "error.message must be at most %d characters", MaxErrorMessageLen)
		}
		a.failure = *failure
		if outcome == chain.OutcomeNotApplied {
			a.failure.Retryable = false // ignored: a not_applied key is reservable anyway (SPEC §4.1)
		}
	default:
		return a, Invalid("outcome", "outcome must be succeeded, failed or not_applied")
	}
	if !utf8.ValidString(externalRef) || utf8.RuneCountInString(externalRef) > MaxExternalRefLen {
		return a, Invalid("external_ref", "external_ref must be at most %d characters", MaxExternalRefLen)
	}
	if !isNull(result) {
		var buf bytes.Buffer
		if err := json.Compact(&buf, result); err != nil {
			return a, Invalid("result", "result is not valid JSON")
		}
		if buf.Len() > MaxResultLen {
			return a, Invalid("result", "result must be at most %d bytes as compact JSON", MaxResultLen)
		}
		if !utf8.Valid(buf.Bytes()) {
			return a, Invalid("result", "result must be UTF-8")
		}
		if err := CheckIJSON(buf.Bytes()); err != nil {
			return a, Invalid("result", "result must be I-JSON (RFC 7493), as input must: %v", err)
		}
		a.result = buf.String()
	}
	return a, nil
}

// ValidErrorCode reports whether c is a well-formed error code: 1–64
// characters of A-Z, 0-9 and _.
func ValidErrorCode(c string) bool {
	if c == "" || len(c) > MaxErrorCodeLen {
		return false
	}
	for i := 0; i < len(c); i++ {
		ch := c[i]
		if !(ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || ch == '_') {
			return false
		}
	}
	return true
}

// sameJSON reports whether two compact JSON texts are equal as JSON
// values: objects as unordered member sets, strings after unescaping, and
// numbers by their exact decimal value (never through float64, so that
// 12345678901234567890 and 12345678901234567891 differ).
func sameJSON(a, b string) bool {
	if a == b {
		return true
	}
	if a == "" || b == "" {
		return false
	}
	va, errA := decodeExact(a)
	vb, errB := decodeExact(b)
	return errA == nil && errB == nil && equalExact(va, vb)
}

func decodeExact(s string) (any, error) {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

func equalExact(a, b any) bool {
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, xv := range x {
			yv, ok := y[k]
			if !ok || !equalExact(xv, yv) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !equalExact(x[i], y[i]) {
				return false
			}
		}
		return true
	case json.Number:
		y, ok := b.(json.Number)
		return ok && sameNumber(string(x), string(y))
	default: // string, bool, nil
		return a == b
	}
}

// sameNumber compares two JSON number literals by exact value, without
// building big numbers (an exponent of 1e999999999 costs nothing).
func sameNumber(a, b string) bool {
	na, okA := normNumber(a)
	nb, okB := normNumber(b)
	return okA && okB && na == nb
}

// decimal is a JSON number as sign, significant digits (no leading or
// trailing zeros) and the exponent of the last digit.
type decimal struct {
	neg    bool
	digits string
	exp    int64
}

func normNumber(s string) (decimal, bool) {
	var d decimal
	if strings.HasPrefix(s, "-") {
		d.neg, s = true, s[1:]
	}
	mant, expPart, hasExp := strings.Cut(strings.ToLower(s), "e")
	if hasExp {
		e, err := parseExponent(expPart)
		if err != nil {
			return d, false
		}
		d.exp = e
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	digits := intPart + frac
	d.exp -= int64(len(frac))
	digits = strings.TrimLeft(digits, "0")
	trimmed := strings.TrimRight(digits, "0")
	d.exp += int64(len(digits) - len(trimmed))
	d.digits = trimmed
	if d.digits == "" { // zero: -0 == 0 == 0.0e5
		return decimal{}, true
	}
	return d, true
}

// parseExponent parses an exponent, saturating far beyond any digit
// count a 64 KiB result can hold.
func parseExponent(s string) (int64, error) {
	neg := false
	switch {
	case strings.HasPrefix(s, "-"):
		neg, s = true, s[1:]
	case strings.HasPrefix(s, "+"):
		s = s[1:]
	}
	if s == "" {
		return 0, fmt.Errorf("empty exponent")
	}
	var n int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("bad exponent")
		}
		if n < math.MaxInt64/100 {
			n = n*10 + int64(c-'0')
		}
	}
	if neg {
		n = -n
	}
	return n, nil
}
