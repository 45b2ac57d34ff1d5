package api

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/verify"
)

// VerificationStatus reports what the periodic verifier has done
// (*verify.Periodic). GET /v1/verification serves it.
type VerificationStatus interface {
	Status() verify.Status
}

var _ VerificationStatus = (*verify.Periodic)(nil)

// auditQuery is the set of query parameters GET /v1/audit accepts.
var auditQuery = map[string]bool{"since": true, "tool": true}

// handleAudit runs the audit of SPEC §5 over the whole ledger and answers
// what `ledgerctl audit --json` prints. The audit rehashes the chain like
// ledgerctl does; one runs at a time, later requests wait their turn. The
// header Ledger-Violations carries the number of integrity violations
// found meanwhile (an audit of a broken chain is not to be trusted).
func (s *Server) handleAudit(w http.ResponseWriter, r *http.Request, n *ledger.Namespace) {
	q, err := parseQuery(r, auditQuery)
	if err != nil {
		s.Error(w, r, err)
		return
	}
	filter := verify.AuditFilter{Tool: q.Get("tool")}
	if v := q.Get("since"); v != "" {
		if err := ParseSince(v, time.Now(), &filter); err != nil {
			s.Error(w, r, &ledger.Error{Code: ledger.ECodeInvalidRequest,
				Message: "since must be a receipt seq, a duration such as 24h or an RFC 3339 time",
				Details: map[string]any{"field": "since"}})
			return
		}
	}
	select {
	case s.auditSem <- struct{}{}:
		defer func() { <-s.auditSem }()
	case <-r.Context().Done():
		return
	}
	src := n.Audit()
	if s.auditStore != nil {
		c, err := s.auditStore.Chain(r.Context(), n.Name())
		if err != nil {
			s.Error(w, r, err)
			return
		}
		src = c
	}
	rep, err := verify.New(src, verify.Opts{Filter: filter}).Check(r.Context())
	if err != nil {
		if r.Context().Err() != nil {
			return // the client left; nobody reads an answer
		}
		s.Error(w, r, err)
		return
	}
	w.Header().Set("Ledger-Violations", strconv.Itoa(rep.ViolationsTotal))
	s.writeJSON(w, http.StatusOK, rep.Audit)
}

// ParseSince sets f's window from the since of an audit (GET
// /v1/audit?since=, ledgerctl audit --since): a receipt seq (digits only),
// a duration before now such as 24h, or an RFC 3339 time.
func ParseSince(s string, now time.Time, f *verify.AuditFilter) error {
	if s != "" && strings.Trim(s, "0123456789") == "" {
		seq, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return fmt.Errorf("seq %q: %w", s, err)
		}
		f.SinceSeq = seq
		return nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return fmt.Errorf("negative duration %q", s)
		}
		f.Since = now.Add(-d)
		return nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return fmt.Errorf("want an RFC 3339 time, a duration or a receipt seq, got %q", s)
	}
	f.Since = t
	return nil
}

// parseQuery parses r's query string, refusing a malformed one and
// unknown or repeated parameters (400 invalid_request).
func parseQuery(r *http.Request, known map[string]bool) (url.Values, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, &ledger.Error{Code: ledger.ECodeInvalidRequest, Message: "query string is malformed"}
	}
	return q, checkQuery(q, known)
}

// checkQuery rejects unknown and repeated query parameters.
func checkQuery(q url.Values, known map[string]bool) error {
	for name, vals := range q {
		if !known[name] {
			return &ledger.Error{Code: ledger.ECodeInvalidRequest, Message: "unknown query parameter " + strconv.Quote(truncate(name, 64)),
				Details: map[string]any{"field": truncate(name, 64)}}
		}
		if len(vals) > 1 {
			return &ledger.Error{Code: ledger.ECodeInvalidRequest, Message: "query parameter " + name + " is given more than once",
				Details: map[string]any{"field": name}}
		}
	}
	return nil
}

// verificationBody is the body of GET /v1/verification. The run's fields
// are present only once a run has finished (ran: true).
type verificationBody struct {
	Enabled       bool   `json:"enabled"`
	EveryMS       int64  `json:"every_ms"`
	Ran           bool   `json:"ran"`
	LastSuccessAt *int64 `json:"last_success_at"`
	*verificationRun
}

type verificationRun struct {
	StartedAt       int64              `json:"started_at"`
	FinishedAt      int64              `json:"finished_at"`
	DurationMS      int64              `json:"duration_ms"`
	Incremental     bool               `json:"incremental"`
	OK              bool               `json:"ok"`
	Error           *string            `json:"error"`
	Receipts        uint64             `json:"receipts"`
	Checked         uint64             `json:"checked"`
	Head            verify.Pin         `json:"head"`
	Violations      []verify.Violation `json:"violations"`
	ViolationsTotal int                `json:"violations_total"`
}

// errVerifyUnreadable is what GET /v1/verification says about a run that
// could not read the ledger; the cause is in ledgerd's log, not here.
const errVerifyUnreadable = "the verifier could not read the ledger; see ledgerd's log"

func (s *Server) handleVerification(w http.ResponseWriter, r *http.Request) {
	body := verificationBody{}
	if s.verification != nil {
		st := s.verification.Status()
		body.Enabled = true
		body.EveryMS = st.Every.Milliseconds()
		if !st.LastSuccess.IsZero() {
			ms := st.LastSuccess.UnixMilli()
			body.LastSuccessAt = &ms
		}
		if run := st.Last; run != nil {
			body.Ran = true
			v := &verificationRun{
				StartedAt:   run.Started.UnixMilli(),
				FinishedAt:  run.Started.Add(run.Duration).UnixMilli(),
				DurationMS:  run.Duration.Milliseconds(),
				Incremental: run.Incremental,
				Head:        verify.Pin{Hash: ledger.Head{}.Hash.String()},
				Violations:  []verify.Violation{},
			}
			if rep := run.Report; rep != nil {
				v.OK, v.Receipts, v.Checked, v.Head = rep.OK, rep.Receipts, rep.Checked, rep.Head
				v.ViolationsTotal = rep.ViolationsTotal
				if rep.Violations != nil {
					v.Violations = rep.Violations
				}
			} else {
				msg := errVerifyUnreadable
				v.Error = &msg
			}
			body.verificationRun = v
		}
	}
	s.writeJSON(w, http.StatusOK, body)
}
