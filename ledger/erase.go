package ledger

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"unicode/utf8"

	"github.com/effect-ledger/effect-ledger/chain"
)

// Erasure of payloads (SPEC §14): in one write, the values of the selected
// receipts' committed fields are deleted and one erase receipt is
// appended, whose set commits to the erased ranges without publishing
// them.

// MaxEraseKeys bounds the keys one erase names.
const MaxEraseKeys = 1000

// MaxEraseReason bounds an erase's reason, in characters.
const MaxEraseReason = 256

// Erase statuses.
const (
	StatusErased         = "erased"
	StatusNothingToErase = "nothing_to_erase"
)

// EraseRequest selects what to erase: every generation of each key, or
// the key generations of a subject.
type EraseRequest struct {
	Keys    []string
	Subject string         // exclusive with Keys
	Fields  chain.FieldSet // 0: all four
	Reason  string
	Actor   string
}

// EraseResult is the outcome of an Erase.
type EraseResult struct {
	Status  string      // StatusErased or StatusNothingToErase
	Receipt *ReceiptRef // the erase receipt; nil when nothing was erased
	Count   uint64      // receipts whose values were erased
	Keys    int         // keys with a value erased
	Inline  int         // selected receipts kept inline, which cannot be erased
	// More: a sweep erased as many as it may (Config.MaxSweep); the next
	// may find more at once.
	More bool
	// Pending are the selected keys still in flight: the receipt that
	// finalizes each is followed by an erase covering it.
	Pending []string
}

func (req *EraseRequest) validate() error {
	if req.Subject != "" {
		if len(req.Keys) > 0 {
			return Invalid("keys", "give exactly one selector: keys or subject")
		}
		if err := CheckSubjects([]string{req.Subject}); err != nil {
			return Invalid("subject", "subject must be 1–%d bytes of UTF-8", MaxSubjectLen)
		}
	} else if len(req.Keys) == 0 || len(req.Keys) > MaxEraseKeys {
		return Invalid("keys", "keys must name 1 to %d idempotency keys", MaxEraseKeys)
	}
	for _, k := range req.Keys {
		if len(k) < MinKeyLen {
			return Invalid("keys", "keys must be idempotency keys of %d–%d bytes", MinKeyLen, MaxKeyLen)
		}
		if err := ValidateKey(k); err != nil {
			return err
		}
	}
	if err := CheckEraseReason(req.Reason); err != nil {
		return err
	}
	if req.Fields == 0 {
		req.Fields = chain.AllFields
	}
	return nil
}

// CheckEraseReason checks an erase receipt's reason (its note): UTF-8 of
// at most MaxEraseReason characters, "" for none. Errors: *Error
// ECodeInvalidRequest.
func CheckEraseReason(reason string) error {
	if !utf8.ValidString(reason) || utf8.RuneCountInString(reason) > MaxEraseReason {
		return Invalid("reason", "reason must be UTF-8 of at most %d characters", MaxEraseReason)
	}
	return nil
}

// Erase erases the payloads of the selected keys' receipts. Errors: *Error
// ECodeInvalidRequest, ECodePayloadsInline (every selected receipt holding
// a value is inline); ErrUnavailable.
func (n *Namespace) Erase(ctx context.Context, req EraseRequest) (*EraseResult, error) {
	if err := req.validate(); err != nil {
		return nil, err
	}
	var mac *SubjectMAC
	if req.Subject != "" {
		macs, err := n.subjectMACs(ctx, []string{req.Subject})
		if err != nil {
			return nil, err
		}
		mac = &macs[0]
		req.Subject = "" // the subject goes no further than its MAC
	}
	var res *EraseResult
	var arch map[uint64]archivedValue
	for try := 0; ; try++ {
		a, pruned, err := n.archived(ctx, req.Keys, mac, req.Fields) // pruned generations (SPEC §16)
		if err != nil {
			return nil, err
		}
		arch = a
		err = n.submit(ctx, "", func(ctx context.Context, t *batchTx) error {
			if t.at.Pruned.Through != pruned {
				return errPrunedMeanwhile // the segments read are not the ones now
			}
			var err error
			res, err = decideErase(ctx, t, &req, mac, arch)
			return err
		})
		if errors.Is(err, errPrunedMeanwhile) && try < 3 {
			continue
		}
		if err != nil {
			return nil, err
		}
		break
	}
	if len(arch) > 0 && res.Receipt != nil {
		if err := n.purgeArchive(ctx); err != nil {
			n.l.logger.ErrorContext(ctx, "erasing archived values failed; the erasure is not purged until a restart or the next erase redoes it",
				"namespace", n.name, "seq", res.Receipt.Seq, "err", err)
		}
	}
	if res.Receipt != nil {
		erasures.WithLabelValues(n.name, "request").Inc()
		n.l.logger.InfoContext(ctx, "payloads erased", "namespace", n.name, "seq", res.Receipt.Seq, "count", res.Count)
	}
	return res, nil
}

// errPrunedMeanwhile: a prune committed between an erase's read of the
// segments and its decision (a refusal: it writes nothing); the erase
// starts again.
var errPrunedMeanwhile = &Error{Code: ECodeUnavailable, Message: "a prune committed while the erase read the archive; retry"}

// decideErase selects, erases and appends the erase receipt; with mac,
// the generations indexed under the subject, whose rows go too; arch are
// the values of pruned generations their segments hold.
func decideErase(ctx context.Context, t *batchTx, req *EraseRequest, mac *SubjectMAC, arch map[uint64]archivedValue) (*EraseResult, error) {
	res := &EraseResult{Status: StatusNothingToErase}
	gens, err := t.selected(ctx, req.Keys, mac)
	if err != nil {
		return nil, err
	}
	if err := t.DeleteSubjects(ctx, mac, req.Keys); err != nil {
		return nil, err
	}
	from, committed, err := t.committedFrom(ctx)
	if err != nil {
		return nil, err
	}
	var cand []uint64
	var asks []Generation
	keyOf := map[uint64]string{}
	for _, g := range gens {
		hist, err := t.generation(ctx, g)
		if err != nil {
			return nil, err
		}
		if a := waitingAsk(hist, t.Now()); a != nil && (g.FirstSeq == 0 || g.FirstSeq == a.Seq) {
			asks = append(asks, Generation{Key: g.Key, FirstSeq: a.Seq})
		}
		if hist, err = t.withConsumed(ctx, hist); err != nil {
			return nil, err
		}
		key := g.Key
		for i := range hist {
			r := &hist[i]
			if err := t.eraseAskInput(ctx, r); err != nil {
				return nil, err
			}
			switch {
			case committed && r.Seq > from && hasCommitment(r): // after a switch, if any
				cand = append(cand, r.Seq)
				keyOf[r.Seq] = key
			case hasInlinePayload(r):
				res.Inline++
			}
		}
	}
	open, err := t.Openings(ctx, cand)
	if err != nil {
		return nil, err
	}
	fields := map[uint64]chain.FieldSet{}
	keys := map[string]bool{}
	for _, seq := range cand {
		if set := keptOf(open[seq], req.Fields); set != 0 {
			fields[seq] = set
			keys[keyOf[seq]] = true
		}
	}
	for seq, v := range arch {
		if seq <= t.at.Pruned.Through {
			fields[seq] |= v.fields
			keys[v.key] = true
		}
	}
	pending, err := t.inFlight(ctx, gens, asks)
	if err != nil {
		return nil, err
	}
	for _, g := range pending {
		res.Pending = append(res.Pending, g.Key)
	}
	res.Pending = slices.Compact(slices.Sorted(slices.Values(res.Pending)))
	if len(fields) == 0 {
		if err := t.markPending(ctx, pending, 0, req); err != nil {
			return nil, err
		}
		if res.Inline > 0 && len(pending) == 0 {
			return nil, &Error{Code: ECodePayloadsInline,
				Message: "every selected receipt keeps its payloads inline: they are part of the chain and cannot be erased",
				Details: map[string]any{"inline": res.Inline}}
		}
		return res, nil
	}
	var subjects []SubjectMAC
	if mac != nil {
		subjects = []SubjectMAC{*mac}
	}
	r, count, err := t.appendErase(ctx, fields, req.Fields, false, req.Actor, req.Reason, subjects)
	if err != nil {
		return nil, err
	}
	if err := t.markPending(ctx, pending, r.Seq, req); err != nil {
		return nil, err
	}
	ref := refOf(&r)
	res.Status, res.Receipt, res.Count, res.Keys = StatusErased, &ref, count, len(keys)
	return res, nil
}

// withConsumed adds to a generation's receipts the ask and the approval
// that one of its reserves consumed (SPEC §13), when they are not among
// them: they precede the generation's first reserve, and §14's erase
// takes their values (the ask's summary, the approver's note) with the
// key's.
func (t *batchTx) withConsumed(ctx context.Context, hist []chain.Receipt) ([]chain.Receipt, error) {
	have := make(map[uint64]bool, len(hist))
	for _, r := range hist {
		have[r.Seq] = true
	}
	var extra []chain.Receipt
	for _, r := range hist {
		if r.Kind != chain.KindReserve || r.RefSeq == 0 || have[r.RefSeq] {
			continue
		}
		approval, err := t.Receipt(ctx, r.RefSeq)
		if err != nil {
			return nil, err
		}
		if approval.Kind != chain.KindApproval || approval.IdempotencyKey != r.IdempotencyKey {
			continue // a renewal's ref_seq: the previous generation's
		}
		have[approval.Seq] = true
		extra = append(extra, approval)
		if !have[approval.RefSeq] {
			ask, err := t.Receipt(ctx, approval.RefSeq)
			if err != nil {
				return nil, err
			}
			have[ask.Seq] = true
			extra = append(extra, ask)
		}
	}
	return append(hist, extra...), nil
}

// eraseAskInput deletes the input an approver was shown (§13) for the ask
// r is: §14's erase takes the keys' approval inputs with their values
// (withConsumed brings in the ask a reserve consumed).
func (t *batchTx) eraseAskInput(ctx context.Context, r *chain.Receipt) error {
	if r.Kind != chain.KindAsk {
		return nil
	}
	return t.SetAskInputDeadline(ctx, r.Seq, 0, t.Now())
}

// appendErase erases the values of fields (seq → fields) and appends the
// erase receipt: fieldSet in its result, the erased ranges' salted set,
// retention when a sweep erased them, and stores the ranges' opening with
// the MACs of the subjects erased. It returns the receipt and how many
// receipts it erased.
func (t *batchTx) appendErase(ctx context.Context, fields map[uint64]chain.FieldSet, fieldSet chain.FieldSet,
	retention bool, actor, reason string, subjects []SubjectMAC) (chain.Receipt, uint64, error) {
	eraseSeq := t.Head().Seq + 1
	if err := t.ErasePayloads(ctx, eraseSeq, fields); err != nil {
		return chain.Receipt{}, 0, err
	}
	ranges := chain.Ranges(slices.Collect(mapKeys(fields)))
	e := &Erasure{Seq: eraseSeq, Salt: chain.NewSalt(), Ranges: ranges, Subjects: subjects}
	result := chain.EraseResult{Set: chain.SetDigest(e.Salt, ranges), Count: chain.RangesCount(ranges),
		Fields: fieldSet.Names(), Retention: retention}
	r, err := t.append(ctx, chain.Receipt{Kind: chain.KindErase, Result: result.Text(), Note: reason,
		Actor: actor, RecordedAt: t.Now()})
	if err != nil {
		return r, 0, err
	}
	if r.Seq != eraseSeq {
		return r, 0, fmt.Errorf("erase: appended at %d, not %d", r.Seq, eraseSeq)
	}
	return r, result.Count, t.PutErasure(ctx, e)
}

// inFlight returns the selected generations that are the current one of
// their key and not final (reserved or interrupted), then asks: the
// selected keys' asks still waiting for an approval or its consumption
// (awaiting_approval), each marked by the ask's seq until the reserve
// that consumes its approval carries the mark to its generation.
func (t *batchTx) inFlight(ctx context.Context, gens, asks []Generation) ([]Generation, error) {
	if c, err := t.committed(ctx); err != nil || !c {
		return nil, err // an inline namespace's keys end inline
	}
	var out []Generation
	seen := map[Generation]bool{}
	for _, a := range asks {
		if !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	for _, g := range gens {
		k, found, err := t.Key(ctx, g.Key)
		if err != nil {
			return nil, err
		}
		if found && !k.finalized() && (g.FirstSeq == 0 || g.FirstSeq == k.FirstSeq) {
			out = append(out, Generation{Key: g.Key, FirstSeq: k.FirstSeq})
		}
	}
	return out, nil
}

// markPending marks the in-flight generations for the erase at eraseSeq.
func (t *batchTx) markPending(ctx context.Context, gens []Generation, eraseSeq uint64, req *EraseRequest) error {
	for _, g := range gens {
		if err := t.addPending(ctx, &PendingErase{Key: g.Key, FirstSeq: g.FirstSeq, EraseSeq: eraseSeq,
			Fields: req.Fields, Actor: req.Actor}); err != nil {
			return err
		}
	}
	return nil
}

// addPending stores mark p, merged with the generation's mark if it has
// one: a later erase of other fields adds to what an earlier one asked
// (never narrows it), and the merged mark covers what the generation
// gained after the earlier erase (the lower erase seq; 0, an erase that
// erased nothing, is the lowest).
func (t *batchTx) addPending(ctx context.Context, p *PendingErase) error {
	had, err := t.Pending(ctx, p.Key, p.FirstSeq)
	if err != nil {
		return err
	}
	if had != nil {
		p.Fields |= had.Fields
		p.EraseSeq = min(p.EraseSeq, had.EraseSeq)
		p.Actor = had.Actor
	}
	return t.PutPending(ctx, p)
}

// carryPending moves the mark of the ask at askSeq (its key was erased
// while it waited for its approval) to the generation of the reserve that
// has just consumed the approval, k's, so that the receipt finalizing it
// is erased too (SPEC §14).
func (t *batchTx) carryPending(ctx context.Context, k *KeyRecord, askSeq uint64) error {
	if c, err := t.committed(ctx); err != nil || !c {
		return err
	}
	p, err := t.Pending(ctx, k.Key, askSeq)
	if err != nil || p == nil {
		return err
	}
	if err := t.DeletePending(ctx, k.Key, askSeq); err != nil {
		return err
	}
	p.FirstSeq = k.FirstSeq
	return t.addPending(ctx, p)
}

// answerPending erases at once the values of r, the answer to an ask
// marked pending (its key was erased while it waited, SPEC §14), so that
// the approver's note is not kept; r is then shown erased. A rejection
// ends the key: its mark goes, with the ask's input. An approval's mark
// waits for the reserve that consumes it (carryPending).
func (t *batchTx) answerPending(ctx context.Context, ask, r *chain.Receipt) error {
	if c, err := t.committed(ctx); err != nil || !c {
		return err
	}
	p, err := t.Pending(ctx, ask.IdempotencyKey, ask.Seq)
	if err != nil || p == nil {
		return err
	}
	if r.Outcome == chain.OutcomeRejected {
		if err := t.DeletePending(ctx, ask.IdempotencyKey, ask.Seq); err != nil {
			return err
		}
		if err := t.eraseAskInput(ctx, ask); err != nil {
			return err
		}
	}
	set := keptOf(r.Open, p.Fields)
	if set == 0 {
		return nil
	}
	if _, _, err := t.appendErase(ctx, map[uint64]chain.FieldSet{r.Seq: set}, p.Fields, false, p.Actor, "", nil); err != nil {
		return err
	}
	return t.shown(ctx, r)
}

// completePending follows final, the receipt that finalized k's
// generation, by the erase its pending mark asks for (SPEC §14): in the
// same transaction, so that its values never stay. It takes every value
// the generation gained after the marking erase: the final receipt's, and
// those of a takeover's reserve or of the approval its reserve consumed.
func (t *batchTx) completePending(ctx context.Context, k *KeyRecord, final *chain.Receipt) error {
	if c, err := t.committed(ctx); err != nil || !c {
		return err // nothing is ever erased, or marked, in an inline namespace
	}
	p, err := t.Pending(ctx, k.Key, k.FirstSeq)
	if err != nil || p == nil {
		return err
	}
	if err := t.DeletePending(ctx, k.Key, k.FirstSeq); err != nil {
		return err
	}
	hist, err := t.generation(ctx, Generation{Key: k.Key, FirstSeq: k.FirstSeq})
	if err == nil {
		hist, err = t.withConsumed(ctx, hist)
	}
	if err != nil {
		return err
	}
	cand := []uint64{final.Seq}
	for i := range hist {
		r := &hist[i]
		if err := t.eraseAskInput(ctx, r); err != nil { // a takeover's ask, made after the erase
			return err
		}
		if r.Seq > p.EraseSeq && r.Seq != final.Seq && hasCommitment(r) {
			cand = append(cand, r.Seq)
		}
	}
	open, err := t.Openings(ctx, cand)
	if err != nil {
		return err
	}
	fields := map[uint64]chain.FieldSet{}
	for _, seq := range cand {
		if set := keptOf(open[seq], p.Fields); set != 0 {
			fields[seq] = set
		}
	}
	if len(fields) == 0 {
		return nil // nothing committed to erase
	}
	_, _, err = t.appendErase(ctx, fields, p.Fields, false, p.Actor, "", nil)
	return err
}

// selected lists the generations an erase selects: every generation of
// each key (from seq 1), or those indexed under the subject's mac.
func (t *batchTx) selected(ctx context.Context, keys []string, mac *SubjectMAC) ([]Generation, error) {
	if mac != nil {
		return t.SubjectGenerations(ctx, *mac)
	}
	var out []Generation
	for _, key := range slices.Compact(slices.Sorted(slices.Values(keys))) {
		out = append(out, Generation{Key: key})
	}
	return out, nil
}

// generation returns the receipts of g: from its first reserve up to the
// reserve that starts the key's next generation (SPEC §12), or every
// receipt of the key when g names none.
func (t *batchTx) generation(ctx context.Context, g Generation) ([]chain.Receipt, error) {
	hist, err := t.KeyHistory(ctx, g.Key, g.FirstSeq)
	if err != nil || g.FirstSeq == 0 {
		return hist, err
	}
	ref := t.refReader(ctx)
	for i := range hist {
		r := &hist[i]
		if r.Seq == g.FirstSeq || r.Kind != chain.KindReserve {
			continue
		}
		next, err := StartsGeneration(r, t.n.keyTTL, ref)
		if err != nil {
			return nil, err
		}
		if next {
			return hist[:i], nil
		}
	}
	return hist, nil
}

// keptOf returns the fields of want whose values o still keeps.
func keptOf(o *chain.Opening, want chain.FieldSet) chain.FieldSet {
	var set chain.FieldSet
	for _, f := range chain.PayloadFields {
		if p := o.Get(f); p != nil && p.ErasedBy == 0 && want.Has(f) {
			set = set.With(f)
		}
	}
	return set
}

// quoted is m, a refusal's quote of receipt r (SPEC §14: the one shape,
// refusals included), with "erased" when a field of r is erased.
func quoted(m map[string]any, r *chain.Receipt) map[string]any {
	if erased := erasedNames(r.Open); erased != nil {
		m["erased"] = erased
	}
	return m
}

// erasedNames is o's erased fields by name, or nil.
func erasedNames(o *chain.Opening) map[string]uint64 {
	var out map[string]uint64
	for f, seq := range o.Erased() {
		if out == nil {
			out = map[string]uint64{}
		}
		out[f.Name()] = seq
	}
	return out
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// hasInlinePayload reports whether r holds a payload value in the chain
// itself (an inline receipt that could not be erased).
func hasInlinePayload(r *chain.Receipt) bool {
	for _, f := range chain.PayloadFields {
		if v := r.Field(f); v != "" && !chain.Exempt(r.Kind, f) && !chain.IsCommitment(v) {
			return true
		}
	}
	return false
}
