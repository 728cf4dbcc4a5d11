package header

import (
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Field names as the draft spells them; http.Header canonicalizes them, and
// HTTP field names are case-insensitive.
const (
	NamePolicy     = "RateLimit-Policy"
	NameRateLimit  = "RateLimit"
	NameRetryAfter = "Retry-After"
)

// UnavailableRetryAfter is the Retry-After of a 503 from a limiter that
// could not decide: the quota is not known to be spent, so a short wait is
// the honest advice.
const UnavailableRetryAfter = time.Second

// maxInteger is the largest RFC 9651 Integer (15 digits).
const maxInteger = 999_999_999_999_999

// PolicyItem is one member of a RateLimit-Policy list (draft-11 section 3.1).
type PolicyItem struct {
	Name         string // policy identifier
	Quota        int64  // q: quota units allocated
	Unit         string // qu: quota unit; "" is the default ("requests")
	Window       int64  // w: seconds; 0 omits it (w must be positive)
	PartitionKey []byte // pk; nil omits it
}

// LimitItem is one member of a RateLimit list (draft-11 section 4.1).
type LimitItem struct {
	Name         string // policy identifier
	Remaining    int64  // r: available quota units
	Reset        int64  // t: effective window in seconds; negative omits it
	PartitionKey []byte // pk; nil omits it
}

// PolicyItem is the quota's RateLimit-Policy member.
func (q Quota) PolicyItem() PolicyItem {
	return PolicyItem{Name: q.Policy, Quota: clampInt(q.Limit), Window: q.Window()}
}

// LimitItem is the quota's RateLimit member.
func (q Quota) LimitItem() LimitItem {
	return LimitItem{Name: q.Policy, Remaining: clampInt(q.Remaining), Reset: Seconds(q.Reset)}
}

// clampInt rounds down into [0, maxInteger].
func clampInt(f float64) int64 {
	switch {
	case math.IsNaN(f) || f <= 0:
		return 0
	case f >= maxInteger:
		return maxInteger
	}
	return int64(math.Floor(f))
}

// FormatPolicy serializes a RateLimit-Policy list.
func FormatPolicy(items ...PolicyItem) string {
	b := make([]byte, 0, 48*len(items))
	for i, it := range items {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = appendPolicyItem(b, it)
	}
	return string(b)
}

// appendPolicyItem appends one RateLimit-Policy list member to b.
func appendPolicyItem(b []byte, it PolicyItem) []byte {
	b = appendString(b, it.Name)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, min(max(it.Quota, 0), maxInteger), 10)
	if it.Unit != "" {
		b = append(b, ";qu="...)
		b = appendString(b, it.Unit)
	}
	if it.Window > 0 {
		b = append(b, ";w="...)
		b = strconv.AppendInt(b, min(it.Window, maxInteger), 10)
	}
	return appendBytes(b, it.PartitionKey)
}

// AppendPolicy appends q's RateLimit-Policy list member to b: what
// PolicyValue returns, without the allocation.
func AppendPolicy(b []byte, q Quota) []byte { return appendPolicyItem(b, q.PolicyItem()) }

// AppendRateLimit appends q's RateLimit list member to b: what Value
// returns, without the allocation.
func AppendRateLimit(b []byte, q Quota) []byte { return appendLimitItem(b, q.LimitItem()) }

// FormatRateLimit serializes a RateLimit list.
func FormatRateLimit(items ...LimitItem) string {
	b := make([]byte, 0, 48*len(items))
	for i, it := range items {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = appendLimitItem(b, it)
	}
	return string(b)
}

// appendLimitItem appends one RateLimit list member to b.
func appendLimitItem(b []byte, it LimitItem) []byte {
	b = appendString(b, it.Name)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, min(max(it.Remaining, 0), maxInteger), 10)
	if it.Reset >= 0 {
		b = append(b, ";t="...)
		b = strconv.AppendInt(b, min(it.Reset, maxInteger), 10)
	}
	return appendBytes(b, it.PartitionKey)
}

func appendBytes(b, pk []byte) []byte {
	if pk == nil {
		return b
	}
	b = append(b, ";pk=:"...)
	b = base64.StdEncoding.AppendEncode(b, pk)
	return append(b, ':')
}

// Field is one response header field as a name and a value, for surfaces
// that carry headers as pairs (Envoy's response_headers_to_add).
type Field struct {
	Name, Value string
}

// Fields returns the fields reporting quotas qs, one list member each in
// the order given, then Retry-After when retryAfter is positive. It is the
// multi-quota form of Set. The values are slices of one string: a surface
// that answers every request with them (Envoy's response_headers_to_add)
// pays one allocation for the text, not one per field.
func Fields(retryAfter time.Duration, qs ...Quota) []Field {
	var buf [256]byte
	b := buf[:0]
	var names [3]string
	var ends [3]int
	n := 0
	if len(qs) > 0 {
		for i, q := range qs {
			if i > 0 {
				b = append(b, ", "...)
			}
			b = AppendPolicy(b, q)
		}
		names[n], ends[n] = NamePolicy, len(b)
		n++
		for i, q := range qs {
			if i > 0 {
				b = append(b, ", "...)
			}
			b = AppendRateLimit(b, q)
		}
		names[n], ends[n] = NameRateLimit, len(b)
		n++
	}
	if retryAfter > 0 {
		b = strconv.AppendInt(b, Seconds(retryAfter), 10)
		names[n], ends[n] = NameRetryAfter, len(b)
		n++
	}
	if n == 0 {
		return nil
	}
	all := string(b)
	out := make([]Field, n)
	start := 0
	for i := range out {
		out[i] = Field{Name: names[i], Value: all[start:ends[i]]}
		start = ends[i]
	}
	return out
}

// Unavailable writes the fields of a 503 from a limiter that could not
// decide: Retry-After: 1 and no quota fields, which would describe a bucket
// that was not read.
func Unavailable(h http.Header) {
	h.Del(NamePolicy)
	h.Del(NameRateLimit)
	h.Set(NameRetryAfter, RetryAfter(UnavailableRetryAfter))
}

// ErrSyntax marks a field value that is not a valid list of the draft's
// items. The draft says clients ignore malformed fields.
var ErrSyntax = errors.New("header: malformed field")

// ParsePolicy parses a RateLimit-Policy value (several field lines joined
// with commas). Unknown parameters are ignored, as the draft allows.
func ParsePolicy(v string) ([]PolicyItem, error) {
	members, err := parseList(v)
	if err != nil {
		return nil, err
	}
	out := make([]PolicyItem, 0, len(members))
	for _, m := range members {
		it := PolicyItem{Name: m.name}
		hasQ := false
		for _, p := range m.params {
			switch p.key {
			case "q":
				n, ok := p.val.(int64)
				if !ok || n < 0 {
					return nil, fmt.Errorf("%w: %q: q must be a non-negative integer", ErrSyntax, m.name)
				}
				it.Quota, hasQ = n, true
			case "qu":
				s, ok := p.val.(sfString)
				if !ok {
					return nil, fmt.Errorf("%w: %q: qu must be a string", ErrSyntax, m.name)
				}
				it.Unit = string(s)
			case "w":
				n, ok := p.val.(int64)
				if !ok || n <= 0 {
					return nil, fmt.Errorf("%w: %q: w must be a positive integer", ErrSyntax, m.name)
				}
				it.Window = n
			case "pk":
				bs, ok := p.val.([]byte)
				if !ok {
					return nil, fmt.Errorf("%w: %q: pk must be a byte sequence", ErrSyntax, m.name)
				}
				it.PartitionKey = bs
			}
		}
		if !hasQ {
			return nil, fmt.Errorf("%w: %q: q is required", ErrSyntax, m.name)
		}
		out = append(out, it)
	}
	return out, nil
}

// ParseRateLimit parses a RateLimit value. Unknown parameters are ignored.
func ParseRateLimit(v string) ([]LimitItem, error) {
	members, err := parseList(v)
	if err != nil {
		return nil, err
	}
	out := make([]LimitItem, 0, len(members))
	for _, m := range members {
		it := LimitItem{Name: m.name, Reset: -1}
		hasR := false
		for _, p := range m.params {
			switch p.key {
			case "r":
				n, ok := p.val.(int64)
				if !ok || n < 0 {
					return nil, fmt.Errorf("%w: %q: r must be a non-negative integer", ErrSyntax, m.name)
				}
				it.Remaining, hasR = n, true
			case "t":
				n, ok := p.val.(int64)
				if !ok || n < 0 {
					return nil, fmt.Errorf("%w: %q: t must be a non-negative integer", ErrSyntax, m.name)
				}
				it.Reset = n
			case "pk":
				bs, ok := p.val.([]byte)
				if !ok {
					return nil, fmt.Errorf("%w: %q: pk must be a byte sequence", ErrSyntax, m.name)
				}
				it.PartitionKey = bs
			}
		}
		if !hasR {
			return nil, fmt.Errorf("%w: %q: r is required", ErrSyntax, m.name)
		}
		out = append(out, it)
	}
	return out, nil
}

// The parser below is the part of RFC 9651 (Structured Field Values) these
// two fields need: a List of Items whose value is a String, with Parameters
// of any bare type. Inner lists are rejected.

type sfString string

type sfToken string

type sfParam struct {
	key string
	val any // int64, float64, sfString, sfToken, []byte, bool
}

type sfMember struct {
	name   string
	params []sfParam
}

type sfParser struct {
	s   string
	pos int
}

func (p *sfParser) fail(format string, args ...any) error {
	return fmt.Errorf("%w: at byte %d: %s", ErrSyntax, p.pos, fmt.Sprintf(format, args...))
}

func (p *sfParser) eof() bool  { return p.pos >= len(p.s) }
func (p *sfParser) peek() byte { return p.s[p.pos] }

func (p *sfParser) skipSP() {
	for !p.eof() && p.peek() == ' ' {
		p.pos++
	}
}

func (p *sfParser) skipOWS() {
	for !p.eof() && (p.peek() == ' ' || p.peek() == '\t') {
		p.pos++
	}
}

func parseList(s string) ([]sfMember, error) {
	p := &sfParser{s: strings.Trim(s, " \t")}
	if p.eof() {
		return nil, fmt.Errorf("%w: empty field", ErrSyntax)
	}
	var out []sfMember
	for !p.eof() {
		if p.peek() == '(' {
			return nil, p.fail("inner lists are not allowed in this field")
		}
		v, err := p.bareItem()
		if err != nil {
			return nil, err
		}
		name, ok := v.(sfString)
		if !ok {
			return nil, p.fail("policy identifier must be a quoted string")
		}
		params, err := p.params()
		if err != nil {
			return nil, err
		}
		out = append(out, sfMember{name: string(name), params: params})
		p.skipOWS()
		if p.eof() {
			break
		}
		if p.peek() != ',' {
			return nil, p.fail("expected ',' between list members")
		}
		p.pos++
		p.skipOWS()
		if p.eof() {
			return nil, p.fail("trailing comma")
		}
	}
	return out, nil
}

func (p *sfParser) params() ([]sfParam, error) {
	var out []sfParam
	for !p.eof() && p.peek() == ';' {
		p.pos++
		p.skipSP()
		key, err := p.key()
		if err != nil {
			return nil, err
		}
		var val any = true
		if !p.eof() && p.peek() == '=' {
			p.pos++
			if val, err = p.bareItem(); err != nil {
				return nil, err
			}
		}
		replaced := false
		for i := range out {
			if out[i].key == key { // a repeated key overwrites (RFC 9651 4.2.3.2)
				out[i].val, replaced = val, true
			}
		}
		if !replaced {
			out = append(out, sfParam{key, val})
		}
	}
	return out, nil
}

func (p *sfParser) key() (string, error) {
	start := p.pos
	if p.eof() || !(isLCAlpha(p.peek()) || p.peek() == '*') {
		return "", p.fail("parameter key must start with a lowercase letter or '*'")
	}
	for !p.eof() {
		c := p.peek()
		if !(isLCAlpha(c) || isDigit(c) || c == '_' || c == '-' || c == '.' || c == '*') {
			break
		}
		p.pos++
	}
	return p.s[start:p.pos], nil
}

func (p *sfParser) bareItem() (any, error) {
	if p.eof() {
		return nil, p.fail("missing value")
	}
	switch c := p.peek(); {
	case c == '-' || isDigit(c):
		return p.number()
	case c == '"':
		return p.str()
	case c == ':':
		return p.bytes()
	case c == '?':
		return p.boolean()
	case isAlpha(c) || c == '*':
		return p.token(), nil
	default:
		return nil, p.fail("unexpected %q", c)
	}
}

func (p *sfParser) number() (any, error) {
	start := p.pos
	if p.peek() == '-' {
		p.pos++
	}
	digits, dot := 0, -1
	for !p.eof() {
		c := p.peek()
		if isDigit(c) {
			digits++
		} else if c == '.' && dot < 0 {
			dot = digits
		} else {
			break
		}
		p.pos++
	}
	text := p.s[start:p.pos]
	switch {
	case digits == 0:
		return nil, p.fail("number without digits")
	case dot < 0:
		if digits > 15 {
			return nil, p.fail("integer longer than 15 digits")
		}
		n, err := strconv.ParseInt(text, 10, 64)
		if err != nil {
			return nil, p.fail("integer %q", text)
		}
		return n, nil
	default:
		if dot > 12 || digits-dot > 3 || digits == dot {
			return nil, p.fail("decimal %q out of range", text)
		}
		f, err := strconv.ParseFloat(text, 64)
		if err != nil {
			return nil, p.fail("decimal %q", text)
		}
		return f, nil
	}
}

func (p *sfParser) str() (any, error) {
	p.pos++ // opening quote
	var b strings.Builder
	for !p.eof() {
		c := p.peek()
		p.pos++
		switch {
		case c == '\\':
			if p.eof() || (p.peek() != '"' && p.peek() != '\\') {
				return nil, p.fail("bad escape in string")
			}
			b.WriteByte(p.peek())
			p.pos++
		case c == '"':
			return sfString(b.String()), nil
		case c < 0x20 || c > 0x7e:
			return nil, p.fail("control or non-ASCII byte in string")
		default:
			b.WriteByte(c)
		}
	}
	return nil, p.fail("unterminated string")
}

func (p *sfParser) bytes() (any, error) {
	p.pos++ // opening colon
	end := strings.IndexByte(p.s[p.pos:], ':')
	if end < 0 {
		return nil, p.fail("unterminated byte sequence")
	}
	enc := p.s[p.pos : p.pos+end]
	// RFC 9651 asks parsers not to fail on non-zero pad bits; StdEncoding
	// (not Strict) ignores them.
	bs, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		return nil, p.fail("byte sequence: %v", err)
	}
	p.pos += end + 1
	if bs == nil {
		bs = []byte{}
	}
	return bs, nil
}

func (p *sfParser) boolean() (any, error) {
	p.pos++
	if p.eof() || (p.peek() != '0' && p.peek() != '1') {
		return nil, p.fail("boolean must be ?0 or ?1")
	}
	v := p.peek() == '1'
	p.pos++
	return v, nil
}

func (p *sfParser) token() sfToken {
	start := p.pos
	p.pos++
	for !p.eof() {
		c := p.peek()
		if !(isTChar(c) || c == ':' || c == '/') {
			break
		}
		p.pos++
	}
	return sfToken(p.s[start:p.pos])
}

func isDigit(c byte) bool   { return c >= '0' && c <= '9' }
func isLCAlpha(c byte) bool { return c >= 'a' && c <= 'z' }
func isAlpha(c byte) bool   { return isLCAlpha(c) || (c >= 'A' && c <= 'Z') }

func isTChar(c byte) bool {
	return isAlpha(c) || isDigit(c) || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
