package api

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/gorilla/mux"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// logPrefix is the tlog-tiles prefix of a namespace (SPEC §9), e.g.
// /log/default/.
const logPrefix = "/log/{ns}/"

// routeLog adds the verifiable log's routes (SPEC §9): the checkpoint and
// tiles of the default namespace, and the JSON proofs. Every one reads
// through the read pool, never the writer.
func (s *Server) routeLog(r *mux.Router) {
	get := []string{http.MethodGet, http.MethodHead}
	r.HandleFunc(logPrefix+"checkpoint", s.inNamespace(s.handleCheckpoint)).Methods(get...)
	r.HandleFunc(logPrefix+"{tile:tile/.+}", s.inNamespace(s.handleTile)).Methods(get...)
	s.handle("/v1/proof/inclusion", s.handleInclusion, get...)
	s.handle("/v1/proof/consistency", s.handleConsistency, get...)
	s.handle("/v1/receipts/{seq}/proof", s.handlePortable, get...)
}

// isLogRoute reports whether a route template is one of the tlog-tiles
// routes that --public-log opens.
func isLogRoute(route string) bool { return strings.HasPrefix(route, logPrefix) }

// CosignedCheckpoints is the source of the checkpoint served when the log
// has witnesses (--witness): the newest one cosigned by the quorum, with
// its cosignature lines, or nil when none is yet.
type CosignedCheckpoints interface {
	Served(ns string) *tlog.Signed
}

func (s *Server) handleCheckpoint(w http.ResponseWriter, r *http.Request, n *ledger.Namespace) {
	var c *tlog.Signed
	var err error
	if s.cosigned != nil {
		if c = s.cosigned.Served(n.Name()); c == nil {
			s.Error(w, r, ledger.Errorf(ledger.ECodeNotCheckpointed, "no checkpoint has been cosigned by the witness quorum yet"))
			return
		}
	} else if c, err = n.LatestCheckpoint(r.Context()); err != nil {
		s.Error(w, r, err)
		return
	}
	if c == nil {
		s.Error(w, r, ledger.Errorf(ledger.ECodeNotCheckpointed, "no checkpoint has been signed yet"))
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(c.Note)))
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte(c.Note))
}

func (s *Server) handleTile(w http.ResponseWriter, r *http.Request, n *ledger.Namespace) {
	t, err := n.ReadTile(r.Context(), mux.Vars(r)["tile"])
	if err != nil {
		s.Error(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(len(t.Data)))
	if t.Full {
		w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
	} else {
		w.Header().Set("Cache-Control", "no-cache")
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(t.Data)
}

// queryInt reads an optional non-negative integer query parameter.
func queryInt(r *http.Request, name string, required bool) (int64, error) {
	q := r.URL.Query()
	v, ok := q[name]
	if !ok {
		if required {
			return 0, &ledger.Error{Code: ledger.ECodeInvalidRequest, Message: name + " is required",
				Details: map[string]any{"field": name}}
		}
		return 0, nil
	}
	n, err := strconv.ParseInt(v[0], 10, 64)
	if err != nil || n < 0 || len(v) > 1 {
		return 0, &ledger.Error{Code: ledger.ECodeInvalidRequest, Message: name + " must be one non-negative integer",
			Details: map[string]any{"field": name}}
	}
	return n, nil
}

// proof answers a proof route: its query holds the required integer
// first and the optional tree size second (0 when absent; when given it
// must name a checkpointed tree, so not 0), which prove is called with.
func (s *Server) proof(w http.ResponseWriter, r *http.Request, first, second string, prove func(a, b int64) (any, error)) {
	a, err := queryInt(r, first, true)
	var b int64
	if err == nil {
		b, err = queryInt(r, second, false)
	}
	if err == nil && b == 0 && r.URL.Query().Has(second) {
		err = &ledger.Error{Code: ledger.ECodeInvalidRequest, Message: second + " must be a checkpointed tree size",
			Details: map[string]any{"field": second}}
	}
	var p any
	if err == nil {
		p, err = prove(a, b)
	}
	if err != nil {
		s.Error(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, p)
}

func (s *Server) handleInclusion(w http.ResponseWriter, r *http.Request, n *ledger.Namespace) {
	s.proof(w, r, "seq", "size", func(seq, size int64) (any, error) {
		return n.InclusionProof(r.Context(), uint64(seq), size)
	})
}

func (s *Server) handleConsistency(w http.ResponseWriter, r *http.Request, n *ledger.Namespace) {
	s.proof(w, r, "from", "to", func(from, to int64) (any, error) {
		return n.ConsistencyProof(r.Context(), from, to)
	})
}

func (s *Server) handlePortable(w http.ResponseWriter, r *http.Request, n *ledger.Namespace) {
	seq, err := pathSeq(r, ledger.ECodeUnknownReceipt)
	if err == nil && seq == 0 {
		err = ledger.Errorf(ledger.ECodeUnknownReceipt, "no receipt with seq 0")
	}
	var erasedBy bool
	if err == nil {
		erasedBy, err = portableErasedBy(r)
	}
	if err != nil {
		s.Error(w, r, err)
		return
	}
	var p *tlog.PortableReceipt
	if s.cosigned != nil {
		// Against the cosigned checkpoint, so that the witnesses' quorum
		// can be checked offline (ledgerctl check-proof --quorum).
		c := s.cosigned.Served(n.Name())
		if c == nil || c.Size < int64(seq) {
			p, err = n.PortableReceiptAt(r.Context(), seq, 0)
		} else if p, err = n.PortableReceiptAt(r.Context(), seq, c.Size); err == nil {
			p.Checkpoint = c.Note
		}
	} else {
		p, err = n.PortableReceipt(r.Context(), seq)
	}
	if err == nil && erasedBy {
		err = n.AddErasedBy(r.Context(), p)
	}
	if err != nil {
		s.Error(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, p)
}

// portableQuery is the set of query parameters GET
// /v1/receipts/{seq}/proof accepts.
var portableQuery = map[string]bool{"erased_by": true}

// portableErasedBy reads ?erased_by=true: the bundle also proves the
// erasure of its erased fields (SPEC §14). Its ranges name every receipt
// erased together, which only admins may read: 403 forbidden for others.
func portableErasedBy(r *http.Request) (bool, error) {
	q, err := parseQuery(r, portableQuery)
	if err != nil {
		return false, err
	}
	erasedBy, err := boolParam(q.Get("erased_by"), "erased_by")
	if err != nil || !erasedBy || actsAsAdmin(r.Context()) {
		return erasedBy, err
	}
	p, _ := PrincipalFromContext(r.Context())
	return false, &ledger.Error{Code: ledger.ECodeForbidden,
		Message: "only an admin token may ask for erased_by: its ranges say which receipts were erased together",
		Details: map[string]any{"role": p.Role, "required": ledger.RoleAdmin}}
}
