// Package testwitness is a small C2SP tlog-witness for tests: it serves
// POST /add-checkpoint, verifies the log's signature, checks the
// consistency proof from the size it last cosigned, and cosigns
// (cosignature/v1). It keeps its state in memory.
package testwitness

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/mod/sumdb/note"

	"github.com/effect-ledger/effect-ledger/tlog"
)

// Witness is an in-memory tlog-witness for the logs whose verifier keys
// it was given.
type Witness struct {
	Signer *tlog.CosignatureSigner
	logs   map[string]note.Verifier // by origin

	mu    sync.Mutex
	state map[string]tlog.Checkpoint // latest cosigned, by origin
	// Corrupt makes it answer with a cosignature whose signature bytes
	// are altered (a forged or broken witness).
	Corrupt  bool
	requests map[int]int // add-checkpoint answers by status
}

// Requests returns how many add-checkpoint requests it answered with
// status.
func (w *Witness) Requests(status int) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.requests[status]
}

// New returns a witness named name with a new key, that witnesses the
// log of verifier key vkey for each of the origins.
func New(name, vkey string, origins ...string) (*Witness, error) {
	s, err := tlog.GenerateCosignatureKey(name)
	if err != nil {
		return nil, err
	}
	v, err := tlog.NewVerifier(vkey)
	if err != nil {
		return nil, err
	}
	w := &Witness{Signer: s, logs: map[string]note.Verifier{}, state: map[string]tlog.Checkpoint{}, requests: map[int]int{}}
	for _, o := range origins {
		w.logs[o] = v
	}
	return w, nil
}

// VerifierKey is the witness's cosignature verifier key.
func (w *Witness) VerifierKey() string { return w.Signer.VerifierKey() }

// Size returns the size it last cosigned for origin.
func (w *Witness) Size(origin string) int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.state[origin].Size
}

// SetSize makes the witness believe it last cosigned checkpoint c (to
// test the 409 recovery: a witness that cosigned before ledgerd started).
func (w *Witness) SetSize(c tlog.Checkpoint) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.state[c.Origin] = c
}

// ServeHTTP serves POST /add-checkpoint.
func (w *Witness) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	status, ctype, body := w.add(r)
	w.mu.Lock()
	w.requests[status]++
	w.mu.Unlock()
	rw.Header().Set("Content-Type", ctype)
	rw.WriteHeader(status)
	_, _ = io.WriteString(rw, body)
}

func (w *Witness) add(r *http.Request) (int, string, string) {
	const text = "text/plain; charset=utf-8"
	if r.URL.Path != "/add-checkpoint" {
		return http.StatusNotFound, text, "not found\n"
	}
	if r.Method != http.MethodPost {
		return http.StatusMethodNotAllowed, text, "POST only\n"
	}
	raw, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		return http.StatusBadRequest, text, "read body\n"
	}
	old, proof, msg, err := parseRequest(raw)
	if err != nil {
		return http.StatusBadRequest, text, err.Error() + "\n"
	}
	origin, _, _ := strings.Cut(string(msg), "\n")
	v, ok := w.logs[origin]
	if !ok {
		return http.StatusNotFound, text, "unknown log origin\n"
	}
	c, err := tlog.OpenCheckpoint(msg, v, "")
	if err != nil {
		return http.StatusForbidden, text, "the checkpoint's signature does not verify\n"
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	last := w.state[origin]
	if old != last.Size {
		return http.StatusConflict, tlog.SizeContentType, strconv.FormatInt(last.Size, 10) + "\n"
	}
	if c.Size < old {
		return http.StatusBadRequest, text, "the checkpoint is smaller than old\n"
	}
	if err := tlog.CheckConsistency(proof, c.Size, c.Root, old, last.Root); err != nil {
		return http.StatusUnprocessableEntity, text, "the consistency proof does not verify\n"
	}
	signed, err := note.Sign(&note.Note{Text: c.Text()}, w.Signer)
	if err != nil {
		return http.StatusInternalServerError, text, "sign\n"
	}
	w.state[origin] = c
	line := string(signed[len(tlog.NoteText(signed))+1:])
	if w.Corrupt {
		line = corrupt(line)
	}
	return http.StatusOK, text, line
}

// corrupt flips a bit of the signature in a signature line.
func corrupt(line string) string {
	i := strings.LastIndex(line, " ")
	sig, err := base64.StdEncoding.DecodeString(strings.TrimSpace(line[i+1:]))
	if err != nil || len(sig) < 20 {
		return line
	}
	sig[len(sig)-1] ^= 1
	return line[:i+1] + base64.StdEncoding.EncodeToString(sig) + "\n"
}

// parseRequest splits an add-checkpoint body: "old N", proof lines, an
// empty line, then the signed checkpoint.
func parseRequest(raw []byte) (int64, []tlog.Hash, []byte, error) {
	head, msg, ok := bytes.Cut(raw, []byte("\n\n"))
	if !ok {
		return 0, nil, nil, errors.New("no empty line before the checkpoint")
	}
	sc := bufio.NewScanner(bytes.NewReader(head))
	if !sc.Scan() {
		return 0, nil, nil, errors.New("no old line")
	}
	n, ok := strings.CutPrefix(sc.Text(), "old ")
	old, err := strconv.ParseInt(n, 10, 64)
	if !ok || err != nil || old < 0 || strconv.FormatInt(old, 10) != n {
		return 0, nil, nil, fmt.Errorf("bad old line %q", sc.Text())
	}
	var proof []tlog.Hash
	for sc.Scan() {
		b, err := base64.StdEncoding.DecodeString(sc.Text())
		var h tlog.Hash
		if err != nil || len(b) != len(h) {
			return 0, nil, nil, fmt.Errorf("bad proof line %q", sc.Text())
		}
		copy(h[:], b)
		proof = append(proof, h)
	}
	if len(proof) > 63 {
		return 0, nil, nil, errors.New("proof too long")
	}
	return old, proof, msg, nil
}
