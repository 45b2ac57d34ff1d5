package tlog

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/mod/sumdb/note"
	sumdb "golang.org/x/mod/sumdb/tlog"
)

// SizeContentType is the media type of a witness's 409 body (C2SP
// tlog-witness): its latest cosigned size, in decimal.
const SizeContentType = "text/x.tlog.size"

// Witness is one C2SP tlog-witness that the log asks to cosign its
// checkpoints. It remembers, in memory, the size it last cosigned.
type Witness struct {
	Verifier note.Verifier
	URL      string // the witness's prefix; requests go to URL/add-checkpoint
	Client   *http.Client

	mu    sync.Mutex
	size  int64    // the size it last cosigned (or reported in a 409)
	lines []string // its valid cosignature lines on that size
}

// ParseWitness parses a --witness value, <vkey>=<URL>.
func ParseWitness(spec string) (*Witness, error) {
	vkey, u, ok := strings.Cut(spec, "=")
	if !ok {
		return nil, fmt.Errorf("witness %q: want <vkey>=<URL>", spec)
	}
	v, err := NewCosignatureVerifier(vkey)
	if err != nil {
		return nil, fmt.Errorf("witness %q: %w", spec, err)
	}
	pu, err := url.Parse(u)
	if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
		return nil, fmt.Errorf("witness %q: the URL must be http:// or https://", spec)
	}
	return &Witness{Verifier: v, URL: strings.TrimSuffix(u, "/"), Client: &http.Client{Timeout: 10 * time.Second}}, nil
}

// Name is the witness's key name.
func (w *Witness) Name() string { return w.Verifier.Name() }

// Cosigned returns the size the witness last cosigned and its lines.
func (w *Witness) Cosigned() (int64, []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.size, w.lines
}

// WitnessError is a witness's refusal: its HTTP status and body.
type WitnessError struct {
	Witness string
	Status  int
	Body    string
}

// Code names the refusal for ledger_witness_errors_total: a 403 is
// witness_key_unknown (the witness knows no key that signed the
// checkpoint: after a rotation, its operator has not added the new key
// yet, SPEC §9.2), anything else refused.
func (e *WitnessError) Code() string {
	if e.Status == http.StatusForbidden {
		return WitnessKeyUnknown
	}
	return "refused"
}

// WitnessKeyUnknown is the code of a witness's 403.
const WitnessKeyUnknown = "witness_key_unknown"

func (e *WitnessError) Error() string {
	what := map[int]string{
		http.StatusForbidden:           "witness_key_unknown: the witness verifies none of the log's signatures (its operator must add the log's current key for this origin)",
		http.StatusNotFound:            "the witness does not know the log's origin",
		http.StatusUnprocessableEntity: "the witness rejected the consistency proof",
		http.StatusBadRequest:          "the witness rejected the request",
	}[e.Status]
	if what == "" {
		what = "unexpected answer"
	}
	return fmt.Sprintf("witness %s: %s (HTTP %d): %q", e.Witness, what, e.Status, e.Body)
}

// ErrWitnessAhead means a witness has cosigned a larger tree than the one
// offered: either it saw a checkpoint this log has not stored (a fork) or
// another log shares the origin.
var ErrWitnessAhead = errors.New("the witness has cosigned a larger tree than this checkpoint")

// AddCheckpoint sends the signed checkpoint msg (of c) to the witness
// with a consistency proof from the size it last cosigned, following a
// 409 to the size it reports (at most twice), and returns its verified
// cosignature lines. Lines by other keys are dropped; a response with no
// valid cosignature by the witness's key is an error (ErrCosignature).
func (w *Witness) AddCheckpoint(ctx context.Context, msg []byte, c Checkpoint, hr sumdb.HashReader) ([]string, error) {
	w.mu.Lock()
	old, lines := w.size, w.lines
	w.mu.Unlock()
	if old == c.Size && len(lines) > 0 {
		return lines, nil
	}
	for attempt := 0; ; attempt++ {
		if old > c.Size {
			return nil, fmt.Errorf("witness %s: %w (%d > %d)", w.Name(), ErrWitnessAhead, old, c.Size)
		}
		proof, err := ProveConsistency(c.Size, old, hr)
		if err != nil {
			return nil, fmt.Errorf("witness %s: %w", w.Name(), err)
		}
		var body bytes.Buffer
		fmt.Fprintf(&body, "old %d\n", old)
		for _, h := range proof {
			body.WriteString(base64.StdEncoding.EncodeToString(h[:]) + "\n")
		}
		body.WriteString("\n")
		body.Write(msg)
		status, ctype, resp, err := w.post(ctx, body.Bytes())
		if err != nil {
			witnessRequests.WithLabelValues("error").Inc()
			return nil, err
		}
		switch {
		case status == http.StatusOK:
			got, err := VerifyCosignatures(NoteText(msg), strings.Split(strings.TrimSuffix(resp, "\n"), "\n"), w.Verifier)
			if err != nil {
				witnessRequests.WithLabelValues("invalid_cosignature").Inc()
				return nil, fmt.Errorf("witness %s: %w", w.Name(), err)
			}
			witnessRequests.WithLabelValues("cosigned").Inc()
			w.mu.Lock()
			w.size, w.lines = c.Size, got
			w.mu.Unlock()
			return got, nil
		case status == http.StatusConflict && attempt < 2:
			witnessRequests.WithLabelValues("conflict").Inc()
			mt, _, _ := strings.Cut(ctype, ";")
			n, perr := strconv.ParseInt(strings.TrimSpace(resp), 10, 64)
			if strings.TrimSpace(mt) != SizeContentType || perr != nil || n < 0 {
				return nil, &WitnessError{Witness: w.Name(), Status: status, Body: truncateBody(resp)}
			}
			w.mu.Lock()
			w.size, w.lines = n, nil
			w.mu.Unlock()
			old = n
		default:
			witnessRequests.WithLabelValues("refused").Inc()
			e := &WitnessError{Witness: w.Name(), Status: status, Body: truncateBody(resp)}
			witnessErrors.WithLabelValues(w.Name(), e.Code()).Inc()
			return nil, e
		}
	}
}

// post sends one add-checkpoint request and reads up to 64 KiB of answer.
func (w *Witness) post(ctx context.Context, body []byte) (int, string, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL+"/add-checkpoint", bytes.NewReader(body))
	if err != nil {
		return 0, "", "", fmt.Errorf("witness %s: %w", w.Name(), err)
	}
	resp, err := w.Client.Do(req)
	if err != nil {
		return 0, "", "", fmt.Errorf("witness %s: %w", w.Name(), err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return 0, "", "", fmt.Errorf("witness %s: read answer: %w", w.Name(), err)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), string(b), nil
}

func truncateBody(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}

// CheckpointSource is what the witness loop reads of a log's storage.
type CheckpointSource interface {
	// HashReader reads stored tree hashes.
	HashReader(ctx context.Context) sumdb.HashReader
	// LatestCheckpoint returns the largest stored checkpoint, nil if none.
	LatestCheckpoint(ctx context.Context) (*Signed, error)
}

// Witnessing sends each new checkpoint to the witnesses and keeps the
// checkpoint to serve: the newest one cosigned by at least Quorum of
// them, with their cosignature lines appended to the log's signature.
// Until a newer checkpoint reaches the quorum, the previous one is served.
type Witnessing struct {
	Source   CheckpointSource
	Verifier note.Verifier // the log's key, to parse stored checkpoints
	// Handover is the key the log hands over from (SPEC §9.2), nil if
	// none: a stored checkpoint signed by either is sent.
	Handover  note.Verifier
	Witnesses []*Witness
	Quorum    int
	Interval  time.Duration
	Logger    *slog.Logger

	mu     sync.Mutex
	served *Signed
	errs   map[string]string // last error logged per witness
}

// Served returns the checkpoint to serve, with its cosignature lines, or
// nil when none has reached the quorum yet.
func (ws *Witnessing) Served() *Signed {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.served
}

// Once sends the latest stored checkpoint to every witness that has not
// cosigned it yet (concurrently) and updates the served checkpoint when
// at least Quorum witnesses have cosigned it. It returns how many have.
func (ws *Witnessing) Once(ctx context.Context) (int, error) {
	latest, err := ws.Source.LatestCheckpoint(ctx)
	if err != nil || latest == nil {
		return 0, err
	}
	if s := ws.Served(); s != nil && s.Size >= latest.Size {
		return len(ws.Witnesses), nil
	}
	vs := []note.Verifier{ws.Verifier}
	if ws.Handover != nil {
		vs = append(vs, ws.Handover)
	}
	c, _, err := OpenCheckpointAny([]byte(latest.Note), vs, "")
	if err != nil {
		return 0, fmt.Errorf("witness: stored checkpoint %d: %w", latest.Size, err)
	}
	hr := ws.Source.HashReader(ctx)
	lines := make([][]string, len(ws.Witnesses))
	errs := make([]error, len(ws.Witnesses))
	var wg sync.WaitGroup
	for i, w := range ws.Witnesses {
		wg.Go(func() { lines[i], errs[i] = w.AddCheckpoint(ctx, []byte(latest.Note), c, hr) })
	}
	wg.Wait()
	var all []string
	n := 0
	for i, w := range ws.Witnesses {
		ws.logErr(ctx, w, errs[i])
		if errs[i] == nil {
			all = append(all, lines[i]...)
			n++
		}
	}
	if n < ws.Quorum {
		return n, nil
	}
	note := strings.TrimSuffix(latest.Note, "\n") + "\n"
	for _, l := range all {
		note += l + "\n"
	}
	served := *latest
	served.Note = note
	ws.mu.Lock()
	ws.served = &served
	ws.mu.Unlock()
	witnessedSize.Set(float64(served.Size))
	return n, nil
}

// logErr logs a witness's failure once per distinct error.
func (ws *Witnessing) logErr(ctx context.Context, w *Witness, err error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.errs == nil {
		ws.errs = map[string]string{}
	}
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if msg == ws.errs[w.Name()] {
		return
	}
	ws.errs[w.Name()] = msg
	if err != nil && ctx.Err() == nil {
		ws.logger().WarnContext(ctx, "witness did not cosign", "witness", w.Name(), "url", w.URL, "err", err)
	}
}

func (ws *Witnessing) logger() *slog.Logger {
	if ws.Logger == nil {
		return slog.Default()
	}
	return ws.Logger
}

// Run calls Once every Interval until ctx ends.
func (ws *Witnessing) Run(ctx context.Context) {
	t := time.NewTicker(ws.Interval)
	defer t.Stop()
	var lastErr string
	for {
		if _, err := ws.Once(ctx); err != nil && ctx.Err() == nil && err.Error() != lastErr {
			ws.logger().ErrorContext(ctx, "witnessing failed", "err", err)
			lastErr = err.Error()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
