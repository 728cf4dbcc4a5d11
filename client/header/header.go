package header

import (
	"math"
	"net/http"
	"strconv"
	"time"
)

// Quota describes the deciding rule's bucket after a decision.
type Quota struct {
	Policy     string        // policy identifier: the rule name
	Limit      float64       // burst B, the quota q
	Rate       float64       // refill r in tokens/s (0: fixed allowance)
	Remaining  float64       // tokens left
	Reset      time.Duration // until the bucket is full again
	RetryAfter time.Duration // until a retry could succeed; 0 if none can
}

// Window is the draft's w parameter: the time an empty bucket takes to
// refill to q, in whole seconds (at least 1). A token bucket has no fixed
// window; this is the closest honest reading. A fixed allowance (r = 0) has
// no window and returns 0 (w is omitted).
func (q Quota) Window() int64 {
	if q.Rate <= 0 {
		return 0
	}
	return max(1, int64(math.Ceil(q.Limit/q.Rate)))
}

// Seconds rounds a duration UP to whole seconds, as Retry-After requires: a
// client that waits the advertised time must not arrive early.
func Seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	// Not (d + time.Second - 1) / time.Second: that overflows for the
	// longest durations (a lease's refill rate near zero).
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

// RetryAfter formats the Retry-After value, or "" when no wait can help.
func RetryAfter(d time.Duration) string {
	if d <= 0 {
		return ""
	}
	return strconv.FormatInt(Seconds(d), 10)
}

// PolicyValue formats one RateLimit-Policy list member: "name";q=100;w=10.
func PolicyValue(q Quota) string { return FormatPolicy(q.PolicyItem()) }

// Value formats one RateLimit list member: "name";r=50;t=30, where r is the
// remaining quota (whole units, rounded down) and t the seconds until it is
// fully restored (rounded up).
func Value(q Quota) string { return FormatRateLimit(q.LimitItem()) }

// Set writes RateLimit-Policy and RateLimit, and Retry-After when the quota
// says a retry can succeed later. It replaces earlier values of these fields.
func Set(h http.Header, q Quota) {
	h.Set(NamePolicy, PolicyValue(q))
	h.Set(NameRateLimit, Value(q))
	if ra := RetryAfter(q.RetryAfter); ra != "" {
		h.Set(NameRetryAfter, ra)
	} else {
		h.Del(NameRetryAfter)
	}
}

// appendString writes an RFC 8941 sf-string; rule names are restricted to a
// safe alphabet, but escaping keeps the field valid whatever is passed.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e:
			b = append(b, '?')
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
