package rules

import (
	"errors"
	"fmt"
)

// Sentinel errors callers branch on.
var (
	// ErrInvalidFile marks a rules file that could not be used: a syntax error,
	// an unknown field, a value out of range. Every *Problem wraps it, so
	// errors.Is holds for the joined error Parse returns. An unreadable file
	// is not an invalid one: Load wraps the os error instead.
	ErrInvalidFile = errors.New("invalid rules file")
	// ErrInvalidDescriptors marks request descriptors that must be rejected
	// before any matching (the caller answers "invalid", not "unavailable").
	ErrInvalidDescriptors = errors.New("invalid descriptors")
)

// Problem is one thing wrong with a rules file, located precisely enough for
// an editor to jump to it. Parse reports every problem at once, joined with
// errors.Join; use errors.As (or iterate Unwrap() []error) to get them.
type Problem struct {
	File   string
	Line   int // 1-based; 0 when the problem concerns the whole file
	Column int // 1-based; 0 when unknown (the YAML library reports no column for syntax errors)
	Field  string
	Msg    string
}

// Error formats as FILE:LINE:COL: FIELD: MESSAGE, the form compilers use, so
// editors and CI annotate the right place.
func (p *Problem) Error() string {
	loc := p.File
	if p.Line > 0 {
		loc += fmt.Sprintf(":%d", p.Line)
		if p.Column > 0 {
			loc += fmt.Sprintf(":%d", p.Column)
		}
	}
	if p.Field == "" {
		return loc + ": " + p.Msg
	}
	return loc + ": " + p.Field + ": " + p.Msg
}

// Unwrap makes every problem an ErrInvalidFile.
func (p *Problem) Unwrap() error { return ErrInvalidFile }
