// Package logging builds the log/slog logger the binaries' --log-level and --log-format flags
// describe, so that ledgerd and ledger-mcp log alike.
package logging

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
)

// Flags are the binaries' --log-level and --log-format.
type Flags struct {
	Level, Format string
}

// Register declares --log-level and --log-format on fs.
func (f *Flags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.Level, "log-level", "info", "log `level`: debug, info, warn or error")
	fs.StringVar(&f.Format, "log-format", "text", "log `format`: text or json")
}

// Logger returns the logger the flags describe, writing to w.
func (f *Flags) Logger(w io.Writer) (*slog.Logger, error) { return New(w, f.Level, f.Format) }

// New returns a logger writing to w at level ("debug", "info", "warn" or "error", as
// slog.Level parses it) in format ("text" or "json"). Its errors name the flag at fault.
func New(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format must be text or json, not %q", format)
}
