package api

import (
	"context"
	"errors"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/effect-ledger/effect-ledger/internal/metrics"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// statusOf maps every contract error code to its HTTP status (SPEC §4).
var statusOf = map[string]int{
	ledger.ECodeInvalidJSON:         http.StatusBadRequest,
	ledger.ECodeInvalidRequest:      http.StatusBadRequest,
	ledger.ECodeInvalidKey:          http.StatusBadRequest,
	ledger.ECodeBodyTooLarge:        http.StatusRequestEntityTooLarge,
	ledger.ECodeUnsupportedMedia:    http.StatusUnsupportedMediaType,
	ledger.ECodeNotFound:            http.StatusNotFound,
	ledger.ECodeMethodNotAllowed:    http.StatusMethodNotAllowed,
	ledger.ECodeUnavailable:         http.StatusServiceUnavailable,
	ledger.ECodeUnauthorized:        http.StatusUnauthorized,
	ledger.ECodeForbidden:           http.StatusForbidden,
	ledger.ECodeRateLimited:         http.StatusTooManyRequests,
	ledger.ECodeInternal:            http.StatusInternalServerError,
	ledger.ECodeIntegrityError:      http.StatusInternalServerError,
	ledger.ECodeStorageCorrupt:      http.StatusServiceUnavailable,
	ledger.ECodeFingerprintMismatch: http.StatusUnprocessableEntity,
	ledger.ECodeInProgress:          http.StatusConflict,
	ledger.ECodeUnsafeResume:        http.StatusConflict,
	ledger.ECodeRetryNotAllowed:     http.StatusConflict,
	ledger.ECodeAttemptConflict:     http.StatusConflict,
	ledger.ECodeUnknownKey:          http.StatusNotFound,
	ledger.ECodeStaleReservation:    http.StatusConflict,
	ledger.ECodeAlreadyFinalized:    http.StatusConflict,
	ledger.ECodeNotInterrupted:      http.StatusConflict,
	ledger.ECodeUnknownReceipt:      http.StatusNotFound,
	ledger.ECodeNotCheckpointed:     http.StatusNotFound,
	ledger.ECodeKeyRotationConflict: http.StatusConflict,
	ledger.ECodeNotPrunable:         http.StatusConflict,
	ledger.ECodePruned:              http.StatusGone,
	ledger.ECodeUnknownNamespace:    http.StatusNotFound,
	ledger.ECodeNamespaceExists:     http.StatusConflict,
	ledger.ECodeNamespaceLimit:      http.StatusInsufficientStorage,
	ledger.ECodeDeniedByPolicy:      http.StatusForbidden,
	ledger.ECodeApprovalRejected:    http.StatusConflict,
	ledger.ECodeUnchangedRetry:      http.StatusConflict,
	ledger.ECodeKeyRequired:         http.StatusBadRequest,
	ledger.ECodeEffectClassMismatch: http.StatusUnprocessableEntity,
	ledger.ECodeAlreadyAnswered:     http.StatusConflict,
	ledger.ECodeApprovalExpired:     http.StatusGone,
	ledger.ECodeSelfApproval:        http.StatusForbidden,
	ledger.ECodeUnknownApproval:     http.StatusNotFound,
	ledger.ECodeReconcileNotAllowed: http.StatusForbidden,
	ledger.ECodeReconcileTooEarly:   http.StatusConflict,
	ledger.ECodePayloadsInline:      http.StatusConflict,
	ledger.ECodeUnknownErasure:      http.StatusNotFound,
}

// storageCorruptRetry is the Retry-After of storage_corrupt: nothing
// recovers it but an operator, so clients need not come back at once.
const storageCorruptRetry = time.Minute

var httpErrors = metrics.CounterVec("ledger_http_errors_total", "Error responses by contract error code.", "code")

// Error writes err in the contract's error shape with the status of its
// code. Internal errors are logged and shown generically.
func (s *Server) Error(w http.ResponseWriter, r *http.Request, err error) {
	code, msg := ledger.ErrorCode(err), ledger.ErrorMessage(err)
	details := map[string]any{}
	var retryAfter time.Duration
	var de *ledger.Error
	switch {
	case errors.As(err, &de):
		if de.Details != nil {
			details = de.Details
		}
		retryAfter = de.RetryAfter
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		code, msg = ledger.ECodeUnavailable, "the request was cancelled before it was recorded"
	}
	status, ok := statusOf[code]
	if !ok {
		status = http.StatusInternalServerError
	}
	if code == ledger.ECodeStorageCorrupt {
		s.l.Fault(err) // a read the ledger did not see: /readyz answers 503 from now on
		retryAfter = storageCorruptRetry
	}
	if code == ledger.ECodeUnavailable && retryAfter == 0 {
		retryAfter = time.Second
	}
	switch {
	case code == ledger.ECodeInternal:
		s.logger.ErrorContext(r.Context(), "internal error", "method", r.Method, "path", r.URL.Path, "err", err)
	case code == ledger.ECodeUnavailable:
		if quiet, ok := s.unavailableLog.allow(); ok {
			s.logger.WarnContext(r.Context(), "request not recorded", "method", r.Method, "path", r.URL.Path, "err", err,
				"not_logged_before", quiet)
		}
	}
	if code == ledger.ECodeUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="ledgerd"`)
	}
	if retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(int64(math.Ceil(retryAfter.Seconds())), 10))
	}
	httpErrors.WithLabelValues(code).Inc()
	s.writeJSON(w, status, errorBody{Error: errorObject{Code: code, Message: msg, Details: details}})
}

type errorBody struct {
	Error errorObject `json:"error"`
}

type errorObject struct {
	Code    string         `json:"code"`
	Message string         `json:"message"`
	Details map[string]any `json:"details"`
}

// unavailableLogEvery is how often a request answered unavailable is
// logged: while the cause lasts (a full disk, an overload) every request
// gets the answer, and ledger_http_errors_total counts them all.
const unavailableLogEvery = 5 * time.Second

// unavailableLog spaces the log lines of unavailable answers.
type unavailableLog struct {
	mu    sync.Mutex
	last  time.Time
	quiet int // answers not logged since last
}

func (u *unavailableLog) allow() (quiet int, ok bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if !u.last.IsZero() && time.Since(u.last) < unavailableLogEvery {
		u.quiet++
		return 0, false
	}
	quiet, u.quiet, u.last = u.quiet, 0, time.Now()
	return quiet, true
}
