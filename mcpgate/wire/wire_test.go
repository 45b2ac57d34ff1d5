package wire_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
)

// EditObject and EditMeta change what edit changes, and return the text
// as it came where it is no object, its _meta no object, or edit declines.
func TestEditMeta(t *testing.T) {
	move := func(obj, meta map[string]json.RawMessage) bool {
		v, ok := obj["k"]
		if ok {
			delete(obj, "k")
			meta["m"] = v
		}
		return ok
	}
	drop := func(obj, meta map[string]json.RawMessage) bool {
		delete(meta, "m")
		return true
	}
	for _, tt := range []struct {
		desc, in, want string
		edit           func(obj, meta map[string]json.RawMessage) bool
	}{
		{"into a new _meta", `{"k":1,"a":2}`, `{"a":2,"_meta":{"m":1}}`, move},
		{"into a null _meta", `{"k":1,"_meta":null}`, `{"_meta":{"m":1}}`, move},
		{"beside other members", `{"k":1,"_meta":{"p":7}}`, `{"_meta":{"m":1,"p":7}}`, move},
		{"an emptied _meta is dropped", `{"a":2,"_meta":{"m":1}}`, `{"a":2}`, drop},
		{"declined", `{ "a" : 2 }`, `{ "a" : 2 }`, move},
		{"_meta not an object", `{"k":1,"_meta":"x"}`, `{"k":1,"_meta":"x"}`, move},
		{"not an object", `[1]`, `[1]`, move},
		{"null", `null`, `null`, move},
		{"not JSON", `{"k":`, `{"k":`, move},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			got := string(wire.EditMeta(json.RawMessage(tt.in), tt.edit))
			if json.Valid([]byte(tt.want)) && tt.want != tt.in {
				assert.JSONEq(t, tt.want, got)
			} else {
				assert.Equal(t, tt.want, got, "as it came")
			}
		})
	}
}
