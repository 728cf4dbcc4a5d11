package bucket

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// MaxValue bounds burst, rate and cost. Beyond it float64 arithmetic on
// microsecond timestamps loses whole tokens, so larger values are rejected
// rather than silently mis-counted.
const MaxValue = 1e12

// MaxRequestIDLen bounds an idempotency key (it becomes part of a Redis key).
const MaxRequestIDLen = 128

// Sentinel errors callers branch on. Every error a store returns for bad
// input wraps one of them; such errors are returned before any I/O.
var (
	// ErrInvalid marks a request that is malformed (bad cost, limit or id).
	ErrInvalid = errors.New("invalid bucket request")
	// ErrCostExceedsBurst marks a cost that no amount of waiting can admit.
	ErrCostExceedsBurst = errors.New("cost exceeds burst: it can never be admitted")
	// ErrUnavailable marks a store that could not be reached or answered in
	// time; the outcome may be uncertain (the charge may have happened).
	ErrUnavailable = errors.New("bucket store unavailable")
	// ErrAuth marks a store that refused the client's credentials: a
	// wrong password or ACL user (WRONGPASS), or none given to a server
	// that requires one (NOAUTH). Waiting does not fix it; the address's
	// user information must.
	ErrAuth = errors.New("redis authentication failed")
)

// Limit is one rule's bucket shape.
type Limit struct {
	Burst float64 // B: capacity in tokens
	Rate  float64 // r: refill in tokens per second; 0 is a fixed allowance
}

// Validate reports whether the limit is usable.
func (l Limit) Validate() error {
	switch {
	case math.IsNaN(l.Burst) || math.IsInf(l.Burst, 0) || l.Burst <= 0 || l.Burst > MaxValue:
		return fmt.Errorf("%w: burst %v must be in (0, %g]", ErrInvalid, l.Burst, float64(MaxValue))
	case math.IsNaN(l.Rate) || math.IsInf(l.Rate, 0) || l.Rate < 0 || l.Rate > MaxValue:
		return fmt.Errorf("%w: rate %v must be in [0, %g]", ErrInvalid, l.Rate, float64(MaxValue))
	}
	return nil
}

// TimeToFull is how long an empty bucket takes to refill completely: the
// earliest moment its state may be forgotten. Zero rate never refills, so
// such a bucket must be kept forever (returns 0, meaning "no expiry"). A
// refill longer than the largest Duration (a tiny rate) saturates there.
func (l Limit) TimeToFull() time.Duration {
	if l.Rate <= 0 {
		return 0
	}
	us := math.Ceil(l.Burst / l.Rate * 1e6)
	if us >= float64(math.MaxInt64/int64(time.Microsecond)) {
		return math.MaxInt64
	}
	return time.Duration(us) * time.Microsecond
}

// Request is one charge against one bucket.
type Request struct {
	Key       string  // full store key, e.g. Key(rule, subject)
	Limit     Limit   // the rule's bucket shape
	Cost      float64 // tokens to take; > 0
	RequestID string  // optional idempotency key
	// Hot, for a rule in mode auto, makes the bucket a hot-key bucket
	// (hot.go): the store estimates its decision rate, promotes it to
	// leases when hot, and answers Result.Leased while it is. Such a
	// request takes no RequestID.
	Hot *Hot
	// HeldFor (µs), when > 0, makes the take a held one: its tokens are
	// spent elsewhere for up to HeldFor after it (an RLQS assignment that
	// Envoy spends), and an admitted cost is held that long: the bucket
	// refills behind it only to Burst less what is held (model.go, take).
	// Such a request takes no RequestID.
	HeldFor int64
}

// MaxHeldFor bounds Request.HeldFor: an hour.
const MaxHeldFor = int64(time.Hour / time.Microsecond)

// Validate checks a request before any I/O.
func (r Request) Validate() error {
	if r.Key == "" {
		return fmt.Errorf("%w: empty key", ErrInvalid)
	}
	if err := r.Limit.Validate(); err != nil {
		return err
	}
	if math.IsNaN(r.Cost) || math.IsInf(r.Cost, 0) || r.Cost <= 0 || r.Cost > MaxValue {
		return fmt.Errorf("%w: cost %v must be in (0, %g]", ErrInvalid, r.Cost, float64(MaxValue))
	}
	if r.Cost > r.Limit.Burst {
		return fmt.Errorf("%w: cost %v > burst %v", ErrCostExceedsBurst, r.Cost, r.Limit.Burst)
	}
	if err := ValidateRequestID(r.RequestID); err != nil {
		return err
	}
	if r.HeldFor < 0 || r.HeldFor > MaxHeldFor {
		return fmt.Errorf("%w: held for %dµs must be in [0, %d]", ErrInvalid, r.HeldFor, MaxHeldFor)
	}
	if r.HeldFor > 0 && r.RequestID != "" {
		return fmt.Errorf("%w: a held take records no request id", ErrInvalid)
	}
	if r.Hot != nil {
		if r.RequestID != "" {
			return fmt.Errorf("%w: a hot-key bucket records no request ids", ErrInvalid)
		}
		if err := r.Hot.Validate(); err != nil {
			return err
		}
		if r.Limit.Rate <= 0 {
			return fmt.Errorf("%w: a hot-key bucket needs a rate > 0", ErrInvalid)
		}
	}
	return nil
}

// ValidateRequestID accepts "" (no idempotency) or 1..MaxRequestIDLen bytes
// of [A-Za-z0-9._:-]. The id becomes part of a Redis key next to the bucket's
// own key; keeping braces and spaces out means no id can make a record key
// equal to some other bucket's key or move it out of the bucket's hash slot.
func ValidateRequestID(id string) error {
	if len(id) > MaxRequestIDLen {
		return fmt.Errorf("%w: request id is %d bytes, at most %d", ErrInvalid, len(id), MaxRequestIDLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == ':', c == '-':
		default:
			return fmt.Errorf("%w: request id has %q at byte %d; allowed are letters, digits and . _ : -", ErrInvalid, c, i)
		}
	}
	return nil
}

// Result is one decision.
type Result struct {
	Allowed bool
	// Remaining tokens after the decision.
	Remaining float64
	// RetryAfter is (cost - tokens) / rate when denied and rate > 0; zero when
	// allowed or when no wait can help (rate 0).
	RetryAfter time.Duration
	// Reset is the time until the bucket is full again (0 when full, or when
	// rate is 0).
	Reset time.Duration
	// Now is the store's clock reading used for this decision (Redis: server
	// TIME), in microseconds since the Unix epoch. Tests feed it to the model.
	Now int64
	// Replayed is true when the decision was recorded earlier under the same
	// request id and nothing was charged this time.
	Replayed bool
	// Leased (hot-key buckets only) means nothing was decided: the key is
	// promoted, and Promotion says which epoch and for how long. Without
	// Leased, a Promotion with an Epoch means this decision promoted it.
	Leased    bool
	Promotion Promotion
}

// Outcome is one TakeBatch answer: a Result, or an error (for that request
// alone: a batch never fails as a whole).
type Outcome struct {
	Result Result
	Err    error
}

// DefaultRequestIDTTL is how long a store remembers a request id's decision
// when not told otherwise.
const DefaultRequestIDTTL = 10 * time.Minute

// Key names the bucket of one rule and one subject. The hash tag keeps
// everything one decision touches in one Redis Cluster slot.
func Key(rule, subject string) string {
	return "ration:{" + rule + "|" + subject + "}"
}

// KeyHead and KeyTail are what Key puts before and after the subject:
// Key(rule, subject) == KeyHead(rule) + subject + KeyTail. A matcher that
// writes the key around the subject it builds has both in one allocation.
func KeyHead(rule string) string { return "ration:{" + rule + "|" }

// KeyTail: see KeyHead.
const KeyTail = "}"

// HotKey names the hot-key bucket (Request.Hot) of one rule and one subject:
// Key's, in the same slot, with a suffix, so that a plain bucket and a
// hot-key one never share a key (a rule that changes mode between redis
// and auto starts afresh rather than mixing the two scripts).
func HotKey(rule, subject string) string {
	return Key(rule, subject) + ":auto"
}
