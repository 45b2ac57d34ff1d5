package ledger

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
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
	inputHash  string
	leaseMS    uint64
	actor      string
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
	return "rsv_" + hex.EncodeToString(b[:])
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
	return "sha256:" + hex.EncodeToString(sum[:]), nil
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
	if len(a.key) < MinKeyLen {
		a.key, a.generated = NewGeneratedKey(), true
	} else if err := ValidateKey(a.key); err != nil {
		return a, err
	}
	if err := checkID("execution_id", a.execution); err != nil {
		return a, err
	}
	if req.Attempt != nil {
		if *req.Attempt < 1 || *req.Attempt > MaxAttempt {
			return a, invalid("attempt", "attempt must be an integer from 1 to %d", int64(MaxAttempt))
		}
		a.attempt = uint64(*req.Attempt)
	}
	if err := checkID("tool", a.tool); err != nil {
		return a, err
	}
	if !isEffectClass(a.effect) {
		return a, invalid("effect", "effect must be one of none, read, write, destructive, external")
	}
	if a.inputHash != "" && !isNull(req.Input) {
		return a, invalid("input", "give input or input_hash, not both")
	}
	if len(a.inputHash) > MaxInputHashLen || !visibleASCII(a.inputHash) {
		return a, invalid("input_hash", "input_hash must be at most %d bytes of visible ASCII", MaxInputHashLen)
	}
	if !isNull(req.Input) {
		fp, err := Fingerprint(req.Input)
		if err != nil {
			return a, invalid("input", "input cannot be fingerprinted as RFC 8785 JSON: %v", err)
		}
		a.inputHash = fp
	}
	if req.LeaseMS != nil {
		if *req.LeaseMS < MinLeaseMS || *req.LeaseMS > MaxLeaseMS {
			return a, invalid("lease_ms", "lease_ms must be from %d to %d", MinLeaseMS, MaxLeaseMS)
		}
		a.leaseMS = uint64(*req.LeaseMS)
	}
	return a, nil
}

func checkID(field, v string) error {
	if v == "" || len(v) > MaxIDLen || !visibleASCII(v) {
		return invalid(field, "%s is required: 1–%d bytes of visible ASCII (0x21–0x7E)", field, MaxIDLen)
	}
	return nil
}

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
			return a, invalid("error", "error is only allowed with outcome failed")
		}
	case chain.OutcomeFailed:
		if failure == nil {
			return a, invalid("error", "error.code is required with outcome failed")
		}
		if !validErrorCode(failure.Code) {
			return a, invalid("error.code", "error.code must be 1–%d characters of A-Z, 0-9 and _", MaxErrorCodeLen)
		}
		if !utf8.ValidString(failure.Message) || utf8.RuneCountInString(failure.Message) > MaxErrorMessageLen {
			return a, invalid("error.message", "error.message must be at most %d characters", MaxErrorMessageLen)
		}
		a.failure = *failure
	default:
		return a, invalid("outcome", "outcome must be succeeded or failed")
	}
	if !utf8.ValidString(externalRef) || utf8.RuneCountInString(externalRef) > MaxExternalRefLen {
		return a, invalid("external_ref", "external_ref must be at most %d characters", MaxExternalRefLen)
	}
	if !isNull(result) {
		var buf bytes.Buffer
		if err := json.Compact(&buf, result); err != nil {
			return a, invalid("result", "result is not valid JSON")
		}
		if buf.Len() > MaxResultLen {
			return a, invalid("result", "result must be at most %d bytes as compact JSON", MaxResultLen)
		}
		if !utf8.Valid(buf.Bytes()) {
			return a, invalid("result", "result must be UTF-8")
		}
		a.result = buf.String()
	}
	return a, nil
}

func validErrorCode(c string) bool {
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

// sameJSON reports whether two compact JSON texts are equal as JSON values.
func sameJSON(a, b string) bool {
	if a == b {
		return true
	}
	if a == "" || b == "" {
		return false
	}
	ca, errA := jcs.Transform([]byte(a))
	cb, errB := jcs.Transform([]byte(b))
	return errA == nil && errB == nil && bytes.Equal(ca, cb)
}
