package chain_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
)

func TestPruneResult_roundTrip(t *testing.T) {
	p := chain.PruneResult{From: 1, Through: 100, Digest: "sha256:" + strings.Repeat("ab", 32),
		Policy: chain.PrunePolicy{Seq: 7, Text: `{"rules":[{"tool":"pay.*"}]}`}}
	text := p.Text()
	require.Equal(t, `{"digest":"sha256:`+strings.Repeat("ab", 32)+`","from":1,"policy":{"seq":7,"text":"{\"rules\":[{\"tool\":\"pay.*\"}]}"},"through":100}`, text)
	got, err := chain.ParsePruneResult(text)
	require.NoError(t, err)
	require.Equal(t, &p, got)
	none := chain.PruneResult{From: 5, Through: 5, Digest: p.Digest}
	got, err = chain.ParsePruneResult(none.Text())
	require.NoError(t, err)
	require.Equal(t, &none, got)
}

func TestParsePruneResult_refusals(t *testing.T) {
	d := `"sha256:` + strings.Repeat("ab", 32) + `"`
	for name, text := range map[string]string{
		"not JSON":       `{`,
		"unknown member": `{"digest":` + d + `,"extra":1,"from":1,"policy":{"seq":0,"text":""},"through":2}`,
		"from 0":         `{"digest":` + d + `,"from":0,"policy":{"seq":0,"text":""},"through":2}`,
		"through < from": `{"digest":` + d + `,"from":3,"policy":{"seq":0,"text":""},"through":2}`,
		"digest":         `{"digest":"sha256:AB","from":1,"policy":{"seq":0,"text":""},"through":2}`,
		"policy after":   `{"digest":` + d + `,"from":1,"policy":{"seq":4,"text":"{}"},"through":2}`,
		"policy no text": `{"digest":` + d + `,"from":1,"policy":{"seq":2,"text":""},"through":2}`,
		"text no policy": `{"digest":` + d + `,"from":1,"policy":{"seq":0,"text":"{}"},"through":2}`,
		"not canonical":  `{"from":1,"digest":` + d + `,"policy":{"seq":0,"text":""},"through":2}`,
		"spaces":         `{"digest": ` + d + `,"from":1,"policy":{"seq":0,"text":""},"through":2}`,
		"policy member":  `{"digest":` + d + `,"from":1,"policy":{"seq":0,"text":"","x":1},"through":2}`,
	} {
		_, err := chain.ParsePruneResult(text)
		require.ErrorIs(t, err, chain.ErrPruneResult, name)
	}
}
