package chain_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
)

func seqSalt(start byte) chain.Salt {
	var s chain.Salt
	for i := range s {
		s[i] = start + byte(i)
	}
	return s
}

// TestCommit_knownAnswers: the §14 formula, reproducible in a shell:
//
//	printf 'effect-receipt-ledger/payload/v1\x0d\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f{"id":"ch_1"}' | sha256sum
//	printf 'effect-receipt-ledger/payload/v1\x14' ; printf '\xff%.0s' $(seq 16) ; printf 'Jane Doe'   (piped together into sha256sum)
func TestCommit_knownAnswers(t *testing.T) {
	assert.Equal(t, "pc1:8ddcdbe0e830860a8e738012ad80aa04bcf7fd561c0cb497a82bba7eecb77bd9",
		chain.Commit(chain.FieldResult, seqSalt(0), `{"id":"ch_1"}`))
	var ff chain.Salt
	for i := range ff {
		ff[i] = 0xff
	}
	assert.Equal(t, "pc1:d3cb4c4b3114b9326a9c4b4b785eab3cbc716987f810e292b749bfd78c88f3aa",
		chain.Commit(chain.FieldNote, ff, "Jane Doe"))
	// The field number is hashed: the same value and salt in another field differ.
	assert.NotEqual(t, chain.Commit(chain.FieldResult, ff, "x"), chain.Commit(chain.FieldNote, ff, "x"))
}

// TestSetDigest_knownAnswer:
//
//	printf '\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f[[1,3],[7,7]]' | sha256sum
func TestSetDigest_knownAnswer(t *testing.T) {
	rs := chain.Ranges([]uint64{7, 2, 1, 3, 2})
	assert.Equal(t, []chain.Range{{1, 3}, {7, 7}}, rs)
	assert.Equal(t, "[[1,3],[7,7]]", chain.RangesText(rs))
	assert.Equal(t, uint64(4), chain.RangesCount(rs))
	assert.Equal(t, "sha256:9ee3da81a822b20cd676ea13ccae29935506e4875b8025d24d64415e5e6e659b", chain.SetDigest(seqSalt(0), rs))
	for seq, in := range map[uint64]bool{0: false, 1: true, 3: true, 4: false, 7: true, 8: false} {
		assert.Equal(t, in, chain.RangesHold(rs, seq), "seq %d", seq)
	}
	got, err := chain.ParseRanges("[[1,3],[7,7]]")
	require.NoError(t, err)
	assert.Equal(t, rs, got)
	for _, bad := range []string{"[[3,1]]", "[[1,3],[3,4]]", "[[0,1]]", "[[1, 3]]", "[[5,6],[1,2]]", "{}", "[[1,2,3]]"} {
		_, err := chain.ParseRanges(bad)
		assert.Error(t, err, bad)
	}
}

func TestIsCommitment(t *testing.T) {
	good := chain.Commit(chain.FieldResult, seqSalt(3), "v")
	assert.True(t, chain.IsCommitment(good))
	for _, bad := range []string{"", "pc1:", strings.ToUpper(good), good[:len(good)-1], good + "0", "pc2:" + good[4:],
		"pc1:" + strings.Repeat("g", 64)} {
		assert.False(t, chain.IsCommitment(bad), bad)
	}
}

func TestExempt(t *testing.T) {
	for _, k := range []string{chain.KindPolicy, chain.KindApproval, chain.KindErase} {
		assert.True(t, chain.Exempt(k, chain.FieldResult), k)
		assert.False(t, chain.Exempt(k, chain.FieldNote), k)
	}
	assert.True(t, chain.Exempt(chain.KindReserve, chain.FieldNote))
	assert.False(t, chain.Exempt(chain.KindCommit, chain.FieldResult))
	assert.False(t, chain.Exempt(chain.KindAsk, chain.FieldResult))
}

func TestFieldSet(t *testing.T) {
	s, err := chain.ParseFieldSet([]string{"note", "result"})
	require.NoError(t, err)
	assert.Equal(t, []string{"result", "note"}, s.Names())
	assert.False(t, s.Has(chain.FieldExternalRef))
	all, err := chain.ParseFieldSet(nil)
	require.NoError(t, err)
	assert.Equal(t, chain.AllFields, all)
	assert.Equal(t, []string{"external_ref", "result", "error_message", "note"}, all.Names())
	_, err = chain.ParseFieldSet([]string{"tool"})
	assert.Error(t, err)
}

func committedCommit() (chain.Receipt, chain.Opening) {
	r := chain.Receipt{Seq: 2, Kind: chain.KindCommit, IdempotencyKey: "k", ExecutionID: "e", Attempt: 1,
		Tool: "charge", Effect: "write", InputHash: "sha256:" + strings.Repeat("a", 64), Outcome: "succeeded",
		ExternalRef: "ch_1", Result: `{"to":"Jane Doe"}`, RefSeq: 1, Actor: "gw", RecordedAt: 5}
	o := chain.CommitFields(&r)
	return r, o
}

func TestCommitFields(t *testing.T) {
	r, o := committedCommit()
	assert.True(t, chain.IsCommitment(r.ExternalRef))
	assert.True(t, chain.IsCommitment(r.Result))
	assert.Empty(t, r.ErrorMessage, "an empty value stays empty")
	assert.Nil(t, o.Get(chain.FieldErrorMessage))
	assert.Equal(t, "ch_1", o.Get(chain.FieldExternalRef).Value)
	assert.NotEqual(t, o.Get(chain.FieldExternalRef).Salt, o.Get(chain.FieldResult).Salt, "a fresh salt per field")
	assert.Empty(t, o.Check(&r))

	// A reserve's note (§13's changed object) stays inline.
	res := chain.Receipt{Kind: chain.KindReserve, Note: `{"changed":{}}`}
	o2 := chain.CommitFields(&res)
	assert.True(t, o2.Empty())
	assert.Equal(t, `{"changed":{}}`, res.Note)

	// Check finds a changed value and a value for an exempt field.
	o.Get(chain.FieldResult).Value = `{"to":"John"}`
	o.Set(chain.FieldNote, &chain.Payload{Value: "x"})
	assert.Equal(t, []chain.PayloadFault{{Field: chain.FieldResult, Why: chain.FaultMismatch},
		{Field: chain.FieldNote, Why: chain.FaultUnexpected}}, o.Check(&r))
}

// TestReceiptJSON_commitments: the JSON form with values, an erased field
// and salts decodes to the chain form and its opening, whose hash is the
// chain's; re-encoding (§9.1) keeps it.
func TestReceiptJSON_commitments(t *testing.T) {
	r, o := committedCommit()
	r = chain.Link(1, chain.ZeroHash, r)
	o.Set(chain.FieldExternalRef, &chain.Payload{ErasedBy: 9})
	shown := r
	shown.Open = &o
	b, err := json.Marshal(shown)
	require.NoError(t, err)
	s := string(b)
	assert.Contains(t, s, `"external_ref":""`)
	assert.Contains(t, s, `"result":{"to":"Jane Doe"},"result_text":"{\"to\":\"Jane Doe\"}"`)
	assert.Contains(t, s, `"commitments":{"external_ref":"`+r.ExternalRef+`","result":"`+r.Result+`"}`)
	assert.Contains(t, s, `"erased":{"external_ref":9}`)
	assert.Contains(t, s, `"salts":{"result":"`+o.Get(chain.FieldResult).Salt.String()+`"}`)

	for _, in := range append([][]byte{b}, reencode(t, string(b))...) {
		var got chain.Receipt
		require.NoError(t, json.Unmarshal(in, &got))
		assert.Equal(t, r.Result, got.Result, "the chain text is back in the field")
		assert.NoError(t, got.Check())
		assert.Equal(t, *shown.Open, *got.Open)
		assert.Empty(t, got.Open.Check(&got))
	}

	// A chain-form receipt has no commitments member.
	b, err = json.Marshal(r)
	require.NoError(t, err)
	assert.NotContains(t, string(b), "commitments")

	// Inconsistent members are refused.
	for _, bad := range []string{
		`"salts":{"result":"` + o.Get(chain.FieldResult).Salt.String() + `","note":"00"}`,
		`"salts":{}`,
		`"salts":{"result":"zz"}`,
	} {
		in := strings.Replace(s, `"salts":{"result":"`+o.Get(chain.FieldResult).Salt.String()+`"}`, bad, 1)
		var got chain.Receipt
		assert.Error(t, json.Unmarshal([]byte(in), &got), bad)
	}
}

func TestEraseResult(t *testing.T) {
	e := chain.EraseResult{Set: chain.SetDigest(seqSalt(0), []chain.Range{{1, 2}}), Count: 2,
		Fields: []string{"result", "note"}, Retention: true}
	text := e.Text()
	assert.Equal(t, `{"count":2,"fields":["result","note"],"retention":true,"set":"`+e.Set+`"}`, text)
	got, set, err := chain.ParseEraseResult(text)
	require.NoError(t, err)
	assert.Equal(t, e, *got)
	assert.True(t, set.Has(chain.FieldNote))
	for _, bad := range []string{
		strings.Replace(text, `"result","note"`, `"note","result"`, 1),
		strings.Replace(text, `"result","note"`, `"tool"`, 1),
		strings.Replace(text, `"result","note"`, ``, 1),
		strings.Replace(text, `,"retention":true`, `,"retention":false`, 1),
		strings.Replace(text, `{"count"`, `{"x":1,"count"`, 1),
		strings.Replace(text, `"set":"sha256:`, `"set":"sha1:`, 1),
		strings.Replace(text, `:2,`, `: 2,`, 1),
	} {
		_, _, err := chain.ParseEraseResult(bad)
		assert.Error(t, err, bad)
	}
}
