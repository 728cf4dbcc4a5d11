package rules

import (
	"fmt"
	"maps"
	"math/bits"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/ration-dev/ration/internal/bucket"
)

// Match is one rule that applies to a request, and the subject whose bucket
// it charges.
type Match struct {
	Rule *Rule
	// Subject is the wildcard keys' values, "k=v,k2=v2" in key order, with
	// '%', ',', '=', '{', '}' and control bytes percent-encoded (see
	// needsEscape); "" when the rule has no wildcard key, so every matching
	// request shares one bucket.
	Subject string
	// Key is the subject's bucket key, bucket.Key(Rule.Name, Subject), when
	// Set.Match made it ("" otherwise): the subject is then a part of the
	// key's string, so a match costs one allocation where the subject and
	// its key made apart cost two, and a rule without a wildcard key none
	// (its one key is made when the rule is compiled).
	Key string
}

// Match appends to out every rule whose match keys are all present in d with
// an equal value (or any value for "*"), in file order, and returns the
// extended slice. It allocates nothing but the subject strings, each
// written inside its bucket key (one per matched rule with a wildcard key),
// and out's growth, so callers on the hot
// path pass a reused out[:0]. d should have passed ValidateDescriptors.
//
// Match and MatchPairs are not inlined: inlined, the caller sees the call
// of the generic match, whose escape summary it does not have, and moves
// its out buffer to the heap (an allocation per decision); called, they
// carry their own summary, in which out does not escape.
//
//go:noinline
func (s *Set) Match(d map[string]string, out []Match) []Match {
	return match(s, descMap(d), out)
}

// MatchPairs is Match for descriptors decoded as Pairs; p should have
// passed ValidatePairs.
//
//go:noinline
func (s *Set) MatchPairs(p Pairs, out []Match) []Match {
	return match(s, p, out)
}

// descriptors is what matching and validation read of a request's
// descriptors, whichever form they came in: a map (the public APIs, JSON,
// query strings) or Pairs (the gRPC batch decoder, which builds no map).
type descriptors interface {
	get(key string) (string, bool)
	len() int
	// bad reports whether any descriptor has a problem (descriptorProblem);
	// keys lists the keys, for the error path.
	bad() bool
	keys() []string
}

type descMap map[string]string

func (d descMap) get(k string) (string, bool) { v, ok := d[k]; return v, ok }
func (d descMap) len() int                    { return len(d) }
func (d descMap) bad() bool {
	for k, v := range d {
		if descriptorProblem(k, v) != "" {
			return true
		}
	}
	return false
}
func (d descMap) keys() []string { return slices.Collect(maps.Keys(d)) }

// Pair is one descriptor.
type Pair struct{ Key, Value string }

// Pairs are descriptors with distinct keys, in any order: what a map
// holds, without building one. Lookups scan them, which for the handful
// of descriptors a request carries is faster than hashing.
type Pairs []Pair

func (p Pairs) get(k string) (string, bool) {
	for i := range p {
		if p[i].Key == k {
			return p[i].Value, true
		}
	}
	return "", false
}
func (p Pairs) len() int { return len(p) }
func (p Pairs) bad() bool {
	for i := range p {
		if descriptorProblem(p[i].Key, p[i].Value) != "" {
			return true
		}
	}
	return false
}
func (p Pairs) keys() []string {
	keys := make([]string, len(p))
	for i := range p {
		keys[i] = p[i].Key
	}
	return keys
}

func match[D descriptors](s *Set, d D, out []Match) []Match {
	var cand [maxWords]uint64
	for i := range s.index {
		ki := &s.index[i]
		v, ok := d.get(ki.key)
		if !ok {
			continue
		}
		for _, r := range ki.any {
			cand[r>>6] |= 1 << (r & 63)
		}
		for _, r := range ki.exact[v] {
			cand[r>>6] |= 1 << (r & 63)
		}
	}
	for w := 0; w*64 < len(s.rules); w++ {
		for word := cand[w]; word != 0; word &= word - 1 {
			r := s.rules[w*64+bits.TrailingZeros64(word)]
			if subject, key, ok := matchRule(r, d); ok {
				out = append(out, Match{Rule: r, Subject: subject, Key: key})
			}
		}
	}
	return out
}

// match tests one rule and builds its subject and the subject's bucket key
// with a single allocation: the key is written around the subject, which
// is the part of it between the head and the tail. A rule that was not
// compiled (no key head) gets its subject alone, and no key.
func matchRule[D descriptors](r *Rule, d D) (subject, key string, ok bool) {
	var vals [MaxMatchKeys]string // the wildcard keys' values, in key order
	n, size := 0, r.subjLen
	for j, k := range r.keys {
		v, ok := d.get(k)
		switch {
		case !ok:
			return "", "", false
		case r.wild[j]:
			vals[n] = v
			n++
			size += escapedLen(v)
		case v != r.want[j]:
			return "", "", false
		}
	}
	if n == 0 {
		return "", r.key0, true
	}
	head := len(r.keyHead)
	tail := 0
	if head > 0 {
		tail = len(bucket.KeyTail)
	}
	var b strings.Builder
	b.Grow(head + size + tail)
	b.WriteString(r.keyHead)
	n = 0
	for j := range r.keys {
		if r.wild[j] {
			b.WriteString(r.prefix[j])
			writeEscaped(&b, vals[n])
			n++
		}
	}
	if head == 0 {
		return b.String(), "", true
	}
	b.WriteString(bucket.KeyTail)
	key = b.String()
	return key[head : len(key)-tail], key, true
}

// needsEscape lists the bytes a subject must not contain raw: '%' (the
// escape itself, so decoding is unique), ',' and '=' (the separators, so two
// descriptor sets never give the same subject), '{' and '}' (a Redis Cluster
// hash tag inside the key would move the bucket to another slot), and control
// bytes (so subjects print safely in logs). Percent-encoding rather than
// backslashes because an escaped '{' must not contain '{'.
func needsEscape(c byte) bool {
	return c < 0x20 || c == 0x7f || c == '%' || c == ',' || c == '=' || c == '{' || c == '}'
}

func escapedLen(s string) int {
	n := len(s)
	for i := 0; i < len(s); i++ {
		if needsEscape(s[i]) {
			n += 2
		}
	}
	return n
}

func writeEscaped(b *strings.Builder, s string) {
	const hexDigits = "0123456789ABCDEF"
	start := 0
	for i := 0; i < len(s); i++ {
		if c := s[i]; needsEscape(c) {
			b.WriteString(s[start:i])
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&15])
			start = i + 1
		}
	}
	b.WriteString(s[start:])
}

// ValidateDescriptors checks a request's descriptors before any matching:
// 1 to MaxDescriptors entries, keys non-empty, keys and values at most
// MaxKeyLen bytes and valid UTF-8. Values may be empty: an empty value is a
// value, and a "*" rule gives it its own bucket. The error wraps
// ErrInvalidDescriptors and names the first bad key in sorted order, so the
// same request always gets the same answer.
func ValidateDescriptors(d map[string]string) error { return validate(descMap(d)) }

// ValidatePairs is ValidateDescriptors for Pairs (whose keys are distinct).
func ValidatePairs(p Pairs) error { return validate(p) }

func validate[D descriptors](d D) error {
	switch n := d.len(); {
	case n == 0:
		return fmt.Errorf("%w: no descriptors", ErrInvalidDescriptors)
	case n > MaxDescriptors:
		return fmt.Errorf("%w: %d descriptors, at most %d", ErrInvalidDescriptors, n, MaxDescriptors)
	}
	if !d.bad() {
		return nil
	}
	// Only the error path pays for sorting.
	keys := d.keys()
	slices.Sort(keys)
	for _, k := range keys {
		v, _ := d.get(k)
		if msg := descriptorProblem(k, v); msg != "" {
			shown := k
			if len(shown) > 64 {
				shown = shown[:64] + "..."
			}
			return fmt.Errorf("%w: key %q: %s", ErrInvalidDescriptors, shown, msg)
		}
	}
	return nil
}

func descriptorProblem(k, v string) string {
	switch {
	case k == "":
		return "key is empty"
	case len(k) > MaxKeyLen:
		return fmt.Sprintf("key is %d bytes, at most %d", len(k), MaxKeyLen)
	case !utf8.ValidString(k):
		return "key is not valid UTF-8"
	case len(v) > MaxKeyLen:
		return fmt.Sprintf("value is %d bytes, at most %d", len(v), MaxKeyLen)
	case !utf8.ValidString(v):
		return "value is not valid UTF-8"
	}
	return ""
}
