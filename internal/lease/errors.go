package lease

import (
	"errors"
	"fmt"
)

// Sentinel errors callers branch on. Every error Apply, DecodeCommand and
// UnmarshalBinary return wraps exactly one of them, with context.
var (
	// ErrInvalid marks a malformed command: a bad number (NaN, infinite,
	// negative, out of range), an empty or oversized name, a zero sequence
	// number, duplicate renew items. Nothing was applied.
	ErrInvalid = errors.New("invalid lease command")
	// ErrUnknownQuota marks a command naming a quota that does not exist:
	// never configured, or removed once idle (see doc.go, "Bounded state"),
	// by a command that cannot create it (a Fund, or a Grant without
	// Config). Nothing was applied.
	ErrUnknownQuota = errors.New("unknown quota")
	// ErrTooManySubjects marks a command that would create a quota of a
	// rule that already has QuotaConfig.MaxSubjects quotas. Nothing was
	// applied to any quota; a Grant's answer is recorded against its Seq.
	ErrTooManySubjects = errors.New("too many subjects")
	// ErrLeaseExpired marks a renew or release of a lease that is not live
	// for this holder: expired, reclaimed, released, or never granted to it.
	// The holder must stop spending it and ask for a new grant. Its
	// unreturned tokens are not credited.
	ErrLeaseExpired = errors.New("lease expired or unknown")
	// ErrStale marks a command whose sequence number is older than the
	// holder's last applied one (a late or reordered duplicate), or reuses
	// the last one for a different kind of command. Nothing was applied.
	ErrStale = errors.New("stale sequence number")
	// ErrUnknownCommand marks a command type or encoding version this build
	// does not know. A replica must stop rather than skip it and diverge.
	ErrUnknownCommand = errors.New("unknown lease command type or version")
	// ErrCorrupt marks bytes that do not decode into a command or a state
	// snapshot, or a snapshot whose contents break an invariant.
	ErrCorrupt = errors.New("corrupt lease encoding")
)

// code is how an answer's error is recorded for replay (errors themselves
// do not survive a snapshot). Only errors that are answers, recorded against
// a holder's sequence number, have a code; rejections are never recorded.
type code uint8

const (
	codeOK code = iota
	codeLeaseExpired
	codeUnknownQuota
	codeTooManySubjects
	codeLimit // first invalid value, for snapshot validation
)

// err turns a recorded code back into an error wrapping its sentinel.
func (c code) err(context string) error {
	switch c {
	case codeOK:
		return nil
	case codeLeaseExpired:
		return fmt.Errorf("lease: %s: %w", context, ErrLeaseExpired)
	case codeUnknownQuota:
		return fmt.Errorf("lease: %s: %w", context, ErrUnknownQuota)
	case codeTooManySubjects:
		return fmt.Errorf("lease: %s: %w", context, ErrTooManySubjects)
	}
	return fmt.Errorf("lease: %s: answer code %d: %w", context, c, ErrCorrupt)
}
