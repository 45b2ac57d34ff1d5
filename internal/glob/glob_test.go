package glob_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/internal/glob"
)

func TestGlob_Match(t *testing.T) {
	for _, tc := range []struct {
		desc, pattern, name string
		want                bool
	}{
		{"star matches a slash", "*", "admin/delete", true},
		{"star matches dots and slashes", "shop.*", "shop.admin/delete", true},
		{"star matches nothing", "charge*", "charge", true},
		{"prefix", "payments.*", "payments.refund", true},
		{"prefix does not match another", "payments.*", "payment.refund", false},
		{"question mark one byte", "a?c", "a/c", true},
		{"question mark not two bytes", "a?c", "abbc", false},
		{"class", "[ab]x", "bx", true},
		{"negated class", "[!ab]x", "bx", false},
		{"range", "t[0-9]", "t7", true},
		{"escaped star is literal", `a\*`, "a*", true},
		{"escaped star is not a wildcard", `a\*`, "ab", false},
		{"regexp bytes are literal", "a.b+(c)", "a.b+(c)", true},
		{"dot is literal", "a.b", "axb", false},
		{"whole name only", "charge", "charge_all", false},
		{"newline in a name", "*", "a\nb", true},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			g, err := glob.Compile(tc.pattern)
			require.NoError(t, err)
			assert.Equal(t, tc.want, g.Match(tc.name), "%q against %q", tc.pattern, tc.name)
		})
	}
}

func TestGlob_Compile_errors(t *testing.T) {
	for _, p := range []string{"", "[ab", `a\`, "[]"} {
		_, err := glob.Compile(p)
		assert.Error(t, err, "%q", p)
	}
}
