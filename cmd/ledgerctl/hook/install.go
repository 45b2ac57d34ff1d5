package hook

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"

	"github.com/effect-ledger/effect-ledger/internal/atomicfile"
)

// Settings is where an agent reads its hooks and how it names them.
type Settings struct {
	Path    string   // the settings file
	Events  []string // the events the hook command answers
	Matcher string   // the matcher of every tool; "" writes none
}

// SettingsFor returns the settings file of agent: in the project dir, or
// under home for the user's own.
func SettingsFor(agent, dir, home string, user bool) (Settings, error) {
	base := dir
	if user {
		base = home
	}
	switch agent {
	case "claude-code":
		return Settings{Path: filepath.Join(base, ".claude", "settings.json"),
			Events: []string{PreToolUse, PostToolUse, PostToolUseFailure}, Matcher: "*"}, nil
	case "codex":
		return Settings{Path: filepath.Join(base, ".codex", "hooks.json"),
			Events: []string{PreToolUse, PostToolUse}}, nil
	}
	return Settings{}, fmt.Errorf("no settings known for agent %q: write them by hand (docs/hooks.md)", agent)
}

// ours recognises a hook command this package installed, so that a
// second install replaces it instead of adding another.
var ours = regexp.MustCompile(`(^|[/\\ "'])ledgerctl(\.exe)?["']? hook( |$)`)

// member is one member of a JSON object, kept in its order.
type member struct {
	name  string
	value json.RawMessage
}

// Install merges the hook command into the settings file: for each event,
// an entry {"matcher", "hooks": [{"type": "command", "command"}]}
// replacing one it wrote before, or added after the others. Every other
// member, entry and value stays as it was, in its order. A file that is
// not a JSON object is refused and left as it is. It returns the text
// written.
func Install(s Settings, command string) ([]byte, error) {
	old, err := os.ReadFile(s.Path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read %s: %w", s.Path, err)
	}
	var top []member
	if len(bytes.TrimSpace(old)) > 0 {
		if top, err = members(old); err != nil {
			return nil, fmt.Errorf("%s is not a JSON object, left unchanged: %w", s.Path, err)
		}
	}
	hooks, at := []member(nil), -1
	for i, m := range top {
		if m.name == "hooks" {
			if hooks, err = members(m.value); err != nil {
				return nil, fmt.Errorf("%s: \"hooks\" is not a JSON object, left unchanged: %w", s.Path, err)
			}
			at = i
		}
	}
	for _, ev := range s.Events {
		if hooks, err = setEvent(hooks, ev, s.Matcher, command); err != nil {
			return nil, fmt.Errorf("%s: %w; left unchanged", s.Path, err)
		}
	}
	h := encode(hooks)
	if at < 0 {
		top = append(top, member{"hooks", h})
	} else {
		top[at].value = h
	}
	var out bytes.Buffer
	if err := json.Indent(&out, encode(top), "", "  "); err != nil {
		return nil, fmt.Errorf("settings: %w", err)
	}
	out.WriteByte('\n')
	if err := writeFile(s.Path, out.Bytes()); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// setEvent puts the command's entry into the list of event ev.
func setEvent(hooks []member, ev, matcher, command string) ([]member, error) {
	type handler struct {
		Type    string `json:"type"`
		Command string `json:"command"`
	}
	entry := struct {
		Matcher string    `json:"matcher,omitempty"`
		Hooks   []handler `json:"hooks"`
	}{matcher, []handler{{"command", command}}}
	mine, _ := json.Marshal(entry)
	at := -1
	for i, m := range hooks {
		if m.name == ev {
			at = i
		}
	}
	if at < 0 {
		return append(hooks, member{ev, json.RawMessage("[" + string(mine) + "]")}), nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(hooks[at].value, &list); err != nil {
		return nil, fmt.Errorf("hooks.%s is not a list", ev)
	}
	replaced := false
	for i, e := range list {
		var got struct {
			Hooks []handler `json:"hooks"`
		}
		if json.Unmarshal(e, &got) == nil && len(got.Hooks) == 1 && ours.MatchString(got.Hooks[0].Command) {
			list[i], replaced = mine, true
		}
	}
	if !replaced {
		list = append(list, mine)
	}
	v, err := json.Marshal(list)
	if err != nil {
		return nil, fmt.Errorf("hooks.%s: %w", ev, err)
	}
	hooks[at].value = v
	return hooks, nil
}

// members decodes a JSON object's members in order.
func members(data []byte) ([]member, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, errors.New("not an object")
	}
	var out []member
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, err
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		out = append(out, member{t.(string), v})
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err == nil {
		return nil, errors.New("data after the object")
	}
	return out, nil
}

// encode writes members as a compact JSON object.
func encode(ms []member) json.RawMessage {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range ms {
		if i > 0 {
			b.WriteByte(',')
		}
		name, _ := json.Marshal(m.name)
		b.Write(name)
		b.WriteByte(':')
		b.Write(m.value)
	}
	b.WriteByte('}')
	return b.Bytes()
}

// writeFile replaces path with data atomically, keeping its mode (0644
// for a new file).
func writeFile(path string, data []byte) error {
	mode := fs.FileMode(0o644)
	if st, err := os.Stat(path); err == nil {
		mode = st.Mode().Perm()
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := atomicfile.Write(path, data, mode); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
