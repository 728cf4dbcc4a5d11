// Package logformat is -log-format of both binaries: how their log
// records are written to stderr.
package logformat

import (
	"errors"
	"io"
	"log/slog"
	"strings"
)

// Format is a log format.
type Format int

const (
	Text Format = iota // key=value pairs (slog.TextHandler), the default
	JSON               // one JSON object per line (slog.JSONHandler)
)

// Usage is the flag's usage text, the same in both binaries.
const Usage = "log format on stderr: text (key=value pairs) or json (one object per line)"

// Parse reads a -log-format value: text or json, in any case.
func Parse(s string) (Format, error) {
	switch strings.ToLower(s) {
	case "text":
		return Text, nil
	case "json":
		return JSON, nil
	}
	return 0, errors.New("want text or json")
}

// New returns a logger writing records at level or above to w in format.
func New(w io.Writer, format Format, level slog.Leveler) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if format == JSON {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
