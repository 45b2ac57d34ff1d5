package logging_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/internal/logging"
)

func TestNew(t *testing.T) {
	var buf bytes.Buffer
	l, err := logging.New(&buf, "warn", "json")
	require.NoError(t, err)
	l.Info("hidden")
	l.Warn("shown", "k", 1)
	var line map[string]any
	require.NoError(t, json.Unmarshal(buf.Bytes(), &line))
	assert.Equal(t, "shown", line["msg"])

	buf.Reset()
	l, err = logging.New(&buf, "debug", "text")
	require.NoError(t, err)
	l.Debug("d")
	assert.Contains(t, buf.String(), "level=DEBUG msg=d")

	_, err = logging.New(&buf, "loud", "text")
	assert.ErrorContains(t, err, "--log-level")
	_, err = logging.New(&buf, "info", "xml")
	assert.ErrorContains(t, err, `--log-format must be text or json, not "xml"`)
}
