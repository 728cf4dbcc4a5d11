// Package logformat is -log-format of both binaries: how their log
// records are written to stderr, and how often one warning or error is
// (repeat.go).
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
// A warning or error is written at most once a minute per message; one
// line with RepeatedKey stands for the repeats held back (limitRepeats).
func New(w io.Writer, format Format, level slog.Leveler) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler
	if format == JSON {
		h = slog.NewJSONHandler(w, opts)
	} else {
		h = slog.NewTextHandler(w, opts)
	}
	return slog.New(limitRepeats(h, repeatWindow, maxRepeatMessages))
}
