package tasks

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A handle opens to what was sealed, for its owner, under its key, until
// it expires; anything else is errHandle, and the reservation it carries
// cannot be read from it.
func TestTaskHandle(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	now := time.UnixMilli(1764475200000)
	h := taskHandle{ID: "up-1", Key: "dk_1", Token: "rsv_secret", Tool: "job", Owner: "stdio", Exp: now.Add(time.Hour).UnixMilli()}
	s, err := sealHandle(key, h)
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(s, handlePrefix))
	assert.NotContains(t, s, "rsv_secret")
	got, err := openHandle(key, s, "stdio", now)
	require.NoError(t, err)
	assert.Equal(t, h, *got)
	again, err := sealHandle(key, h)
	require.NoError(t, err)
	assert.NotEqual(t, s, again, "a fresh nonce each time")

	tampered := []byte(s)
	tampered[len(tampered)-3] ^= 1
	for name, try := range map[string]func() error{
		"other owner": func() error { _, err := openHandle(key, s, "session:x", now); return err },
		"other key":   func() error { _, err := openHandle(bytes.Repeat([]byte{8}, 32), s, "stdio", now); return err },
		"expired":     func() error { _, err := openHandle(key, s, "stdio", now.Add(2*time.Hour)); return err },
		"tampered":    func() error { _, err := openHandle(key, string(tampered), "stdio", now); return err },
		"upstream id": func() error { _, err := openHandle(key, "up-1", "stdio", now); return err },
		"not base64":  func() error { _, err := openHandle(key, handlePrefix+"!!", "stdio", now); return err },
		"too short":   func() error { _, err := openHandle(key, handlePrefix+"AAAA", "stdio", now); return err },
	} {
		assert.ErrorIs(t, try(), errHandle, name)
	}
}

// Rename swaps the upstream's task id for the handle wherever an
// answer names the task, and leaves numbers as they came.
func TestRenameTask(t *testing.T) {
	for in, want := range map[string]string{
		`{"task":{"taskId":"up-1","status":"working"}}`:                                     `"task":{"status":"working","taskId":"H"}`,
		`{"resultType":"task","taskId":"up-1"}`:                                             `"taskId":"H"`,
		`{"content":[],"_meta":{"io.modelcontextprotocol/related-task":{"taskId":"up-1"}}}`: `{"taskId":"H"}`,
		`{"taskId":"up-1","n":12345678901234567890}`:                                        `"n":12345678901234567890`,
	} {
		got := string(Rename(json.RawMessage(in), "up-1", "H"))
		assert.Contains(t, got, want, in)
		assert.NotContains(t, got, "up-1", in)
	}
	other := json.RawMessage(`{"taskId":"up-2"}`)
	assert.Equal(t, other, Rename(other, "up-1", "H"))
}
