package tlog

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/effect-ledger/effect-ledger/chain"
)

// ErrPortableForm is the parent of errors about a portable receipt's JSON
// form: a field the format does not have, a field given twice, data after
// the receipt. The offline verifier refuses such a document, as the API
// refuses such a request: a verdict handed to a third party must be about
// exactly one reading of the document.
var ErrPortableForm = errors.New("portable receipt is not in its exact form")

// portableFields are the members of a portable receipt.
var portableFields = map[string]bool{"receipt": true, "leaf_index": true, "inclusion": true, "checkpoint": true,
	"payloads": true, "erased": true, "erased_by": true, "keys": true}

// receiptFields are the members of a receipt's JSON form (SPEC §2), with
// the optional result_encoding, result_text (SPEC §9.1) and malformed.
var receiptFields = map[string]bool{"seq": true, "kind": true, "idempotency_key": true, "key_generated": true,
	"execution_id": true, "attempt": true, "tool": true, "effect": true, "idempotent": true, "input_hash": true,
	"outcome": true, "external_ref": true, "result": true, "result_encoding": true, "result_text": true, "error_code": true,
	"error_message": true, "retryable": true, "lease_expires_at": true, "ref_seq": true, "actor": true,
	"note": true, "recorded_at": true, "prev_hash": true, "hash": true, "malformed": true}

// ParsePortable parses one portable receipt from its exact JSON form:
// one object with only the format's members, each once, in the envelope
// and in the receipt, and nothing after it but white space. A receipt
// with result_text (SPEC §9.1) is hashed with that text, and its embedded
// result must be the same JSON value (else an error wrapping
// chain.ErrResultMismatch), so any JSON tool may have re-encoded it; one
// without result_text is hashed with its result's exact bytes.
func ParsePortable(data []byte) (*PortableReceipt, error) {
	if !json.Valid(data) {
		return nil, fmt.Errorf("%w: not one JSON value (trailing data or a syntax error)", ErrPortableForm)
	}
	members, err := checkMembers(data, portableFields)
	if err != nil {
		return nil, err
	}
	if keys, ok := members["keys"]; ok {
		if err := checkKeys(keys); err != nil {
			return nil, err
		}
	}
	receipt, ok := members["receipt"]
	if !ok {
		return nil, fmt.Errorf("%w: no receipt", ErrPortableForm)
	}
	if _, err := checkMembers(receipt, receiptFields); err != nil {
		return nil, fmt.Errorf("receipt: %w", err)
	}
	if payloads, ok := members["payloads"]; ok {
		if err := parseDisclosures(payloads); err != nil {
			return nil, err
		}
	}
	if erasedBy, ok := members["erased_by"]; ok {
		if err := parseErasedBy(erasedBy); err != nil {
			return nil, err
		}
	}
	var p PortableReceipt
	if err := json.Unmarshal(data, &p); err != nil {
		if errors.Is(err, chain.ErrResultMismatch) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %w", ErrPortableForm, err)
	}
	return &p, nil
}

// checkKeys checks each portable receipt of a bundle's keys in its
// exact form, with no keys or erased_by of its own.
func checkKeys(raw json.RawMessage) error {
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return fmt.Errorf("%w: keys: not an array", ErrPortableForm)
	}
	for i, k := range list {
		p, err := ParsePortable(k)
		if err != nil {
			return fmt.Errorf("keys[%d]: %w", i, err)
		}
		if len(p.Keys) > 0 || p.ErasedBy != nil {
			return fmt.Errorf("%w: keys[%d] has keys or erased_by of its own", ErrPortableForm, i)
		}
	}
	return nil
}

// checkMembers checks that the valid JSON data is an object whose
// members are all in known, each once, and returns their raw values by
// name. A nil known accepts every name.
func checkMembers(data []byte, known map[string]bool) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("%w: not a JSON object", ErrPortableForm)
	}
	members := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrPortableForm, err)
		}
		name, _ := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrPortableForm, err)
		}
		if known != nil && !known[name] {
			return nil, fmt.Errorf("%w: unknown field %s", ErrPortableForm, strconv.Quote(name))
		}
		if _, ok := members[name]; ok {
			return nil, fmt.Errorf("%w: field %s appears twice", ErrPortableForm, strconv.Quote(name))
		}
		members[name] = raw
	}
	return members, nil
}

// ReadPortables reads the portable receipts of r, one JSON object after
// another (a JSON Lines file, or several objects), calling f with each
// one's raw bytes; data that is not a whole JSON value ends the read
// with an error wrapping ErrPortableForm.
func ReadPortables(r io.Reader, f func(raw []byte) error) error {
	dec := json.NewDecoder(r)
	for {
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: after %d bytes: %w", ErrPortableForm, dec.InputOffset(), err)
		}
		if err := f(raw); err != nil {
			return err
		}
	}
}
