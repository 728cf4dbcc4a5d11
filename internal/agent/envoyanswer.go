package agent

import (
	"math"
	"strconv"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ration-dev/ration/client/header"
)

// rlsStatus is what one descriptor's DescriptorStatus says: toEnvoy puts
// it in a message, rlsAnswer writes it.
type rlsStatus struct {
	code rlsv3.RateLimitResponse_Code
	// hasLimit: current_limit is set (a rule decided); name, perUnit
	// and, when window > 0, unit SECOND with unit_multiplier window.
	hasLimit bool
	name     string
	perUnit  uint32
	window   uint32
	// hasReset: the bucket was read; remaining and duration_until_reset.
	hasReset  bool
	remaining uint32
	reset     time.Duration
}

// statusOf describes o as Envoy's DescriptorStatus does: burst B per
// window of B/r seconds (the draft's w), the closest reading of a token
// bucket as "requests per unit". A rule of rate 0 has no window and
// reports unit UNKNOWN.
func statusOf(o Response) rlsStatus {
	st := rlsStatus{code: rlsv3.RateLimitResponse_OK}
	if !o.Allowed {
		st.code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if o.Rule == "" {
		return st
	}
	st.hasLimit, st.name = true, o.Rule
	st.perUnit, st.window = limitOf(o.Limit, o.Rate)
	if o.Reason != ReasonUnavailable { // else no bucket was read
		st.hasReset = true
		st.remaining = uint32(min(floorInt(o.Remaining), math.MaxUint32))
		st.reset = o.Reset
	}
	return st
}

// limitOf is current_limit's requests_per_unit and unit_multiplier (0:
// none) for a bucket of burst limit and refill rate.
func limitOf(limit, rate float64) (perUnit, window uint32) {
	perUnit = uint32(min(floorInt(limit), math.MaxUint32))
	if w := (header.Quota{Limit: limit, Rate: rate}).Window(); w > 0 {
		window = uint32(min(w, math.MaxUint32))
	}
	return perUnit, window
}

// envoyVerdict finds the first descriptor over limit and the first denied
// only because its dependency is unreachable (-1: none). With none over
// limit, an unreachable one makes the call fail with UNAVAILABLE (429
// outranks 503), so that Envoy applies its filter's failure_mode_deny.
func envoyVerdict(out []Response) (overLimit int, err error) {
	overLimit, unavailable := -1, -1
	for i, o := range out {
		switch {
		case o.Allowed:
		case CheckStatus(o) == 503:
			if unavailable < 0 {
				unavailable = i
			}
		case overLimit < 0:
			overLimit = i
		}
	}
	if overLimit < 0 && unavailable >= 0 {
		return -1, status.Errorf(codes.Unavailable,
			"ration: descriptor %d: rule %s cannot be decided (limiter store unreachable) and fails closed", unavailable, out[unavailable].Rule)
	}
	return overLimit, nil
}

// rlsAnswer is ShouldRateLimit's answer as the codec writes it: the
// fields of toEnvoy's RateLimitResponse, written as proto.Marshal writes
// them (fields in number order, zero values left out). What a rule's shape
// fixes (current_limit, the RateLimit-Policy member) comes encoded from
// rlsShapes; plan formats the rest once, so that size and append only copy.
type rlsAnswer struct {
	out   []Response
	one   [1]Response
	sts   []rlsOut
	stOne [1]rlsOut
	over  bool
	// hdrs are the response_headers_to_add: values in text, or a
	// shape's policy member.
	hdrs    [3]rlsHeader
	nhdrs   int
	text    []byte
	textBuf [96]byte
}

// rlsOut is one DescriptorStatus as rlsAnswer writes it.
type rlsOut struct {
	code      rlsv3.RateLimitResponse_Code
	shape     *rlsShape // nil: no current_limit
	hasReset  bool
	remaining uint32
	secs      int64
	nanos     int32
}

type rlsHeader struct {
	name  string
	value []byte
}

var rlsAnswers sync.Pool // of *rlsAnswer

func newRLSAnswer(n int) *rlsAnswer {
	a, _ := rlsAnswers.Get().(*rlsAnswer)
	if a == nil {
		a = new(rlsAnswer)
	}
	a.out, a.sts = a.one[:], a.stOne[:]
	if n > 1 {
		a.out, a.sts = make([]Response, n), make([]rlsOut, n)
	}
	return a
}

func (a *rlsAnswer) release() {
	*a = rlsAnswer{}
	rlsAnswers.Put(a)
}

// plan settles the overall code, each descriptor's status and the header
// fields once out is decided, or the call's error.
func (a *rlsAnswer) plan() error {
	overLimit, err := envoyVerdict(a.out)
	if err != nil {
		return err
	}
	for i, o := range a.out {
		a.sts[i] = outOf(o)
	}
	var retryAfter time.Duration
	if overLimit >= 0 {
		a.over = true
		retryAfter = envoyRetryAfter(a.out)
	}
	a.headers(retryAfter)
	return nil
}

// outOf is statusOf(o) with the shape's part taken from the cache.
func outOf(o Response) rlsOut {
	st := statusOf(o)
	out := rlsOut{code: st.code, hasReset: st.hasReset, remaining: st.remaining}
	if st.hasLimit {
		out.shape = shapeOf(o.Rule, o.Limit, o.Rate)
	}
	if st.hasReset {
		out.secs, out.nanos = resetParts(st.reset)
	}
	return out
}

// headers sets hdrs to what header.Fields returns for the deciding rules'
// quotas (envoyQuotas) and retryAfter, the same text, with each policy
// member copied from its shape rather than formatted.
func (a *rlsAnswer) headers(retryAfter time.Duration) {
	var qbuf [4]header.Quota
	qs := envoyQuotas(a.out, qbuf[:0])
	a.text = a.textBuf[:0]
	add := func(name string, from int) {
		a.hdrs[a.nhdrs] = rlsHeader{name: name, value: a.text[from:len(a.text):len(a.text)]}
		a.nhdrs++
	}
	if len(qs) == 1 {
		a.hdrs[0] = rlsHeader{name: header.NamePolicy, value: shapeOf(qs[0].Policy, qs[0].Limit, qs[0].Rate).policy}
		a.nhdrs = 1
	} else if len(qs) > 1 {
		from := len(a.text)
		for i, q := range qs {
			if i > 0 {
				a.text = append(a.text, ", "...)
			}
			a.text = append(a.text, shapeOf(q.Policy, q.Limit, q.Rate).policy...)
		}
		add(header.NamePolicy, from)
	}
	if len(qs) > 0 {
		from := len(a.text)
		for i, q := range qs {
			if i > 0 {
				a.text = append(a.text, ", "...)
			}
			a.text = header.AppendRateLimit(a.text, q)
		}
		add(header.NameRateLimit, from)
	}
	if retryAfter > 0 {
		from := len(a.text)
		a.text = strconv.AppendInt(a.text, header.Seconds(retryAfter), 10)
		add(header.NameRetryAfter, from)
	}
}

// The field numbers of RateLimitResponse and the messages in it.
const (
	rlsOverallCode    = 1 // RateLimitResponse
	rlsStatuses       = 2
	rlsHeadersToAdd   = 3
	rlsStatusCode     = 1 // DescriptorStatus
	rlsCurrentLimit   = 2
	rlsLimitRemaining = 3
	rlsUntilReset     = 4
	rlsPerUnit        = 1 // RateLimit
	rlsUnit           = 2
	rlsName           = 3
	rlsUnitMultiplier = 4
	rlsHeaderKey      = 1 // HeaderValue
	rlsHeaderValue    = 2
)

func (a *rlsAnswer) code() rlsv3.RateLimitResponse_Code {
	if a.over {
		return rlsv3.RateLimitResponse_OVER_LIMIT
	}
	return rlsv3.RateLimitResponse_OK
}

func (a *rlsAnswer) append(b []byte) []byte {
	b = appendVarintField(b, rlsOverallCode, uint64(a.code()))
	for i := range a.sts {
		st := &a.sts[i]
		b = protowire.AppendTag(b, rlsStatuses, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(st.size()))
		b = st.append(b)
	}
	for _, h := range a.hdrs[:a.nhdrs] {
		b = protowire.AppendTag(b, rlsHeadersToAdd, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(h.size()))
		b = appendStringField(b, rlsHeaderKey, h.name)
		if len(h.value) > 0 {
			b = protowire.AppendBytes(protowire.AppendTag(b, rlsHeaderValue, protowire.BytesType), h.value)
		}
	}
	return b
}

func (a *rlsAnswer) size() int {
	n := varintFieldSize(rlsOverallCode, uint64(a.code()))
	for i := range a.sts {
		n += nestedSize(rlsStatuses, a.sts[i].size())
	}
	for _, h := range a.hdrs[:a.nhdrs] {
		n += nestedSize(rlsHeadersToAdd, h.size())
	}
	return n
}

func (h rlsHeader) size() int {
	n := stringFieldSize(rlsHeaderKey, h.name)
	if len(h.value) > 0 {
		n += protowire.SizeTag(rlsHeaderValue) + protowire.SizeBytes(len(h.value))
	}
	return n
}

func (st *rlsOut) append(b []byte) []byte {
	b = appendVarintField(b, rlsStatusCode, uint64(st.code))
	if st.shape != nil {
		b = append(b, st.shape.limit...)
	}
	if st.hasReset {
		b = appendVarintField(b, rlsLimitRemaining, uint64(st.remaining))
		b = protowire.AppendTag(b, rlsUntilReset, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(varintFieldSize(1, uint64(st.secs))+varintFieldSize(2, uint64(st.nanos))))
		b = appendVarintField(b, 1, uint64(st.secs))
		b = appendVarintField(b, 2, uint64(st.nanos))
	}
	return b
}

func (st *rlsOut) size() int {
	n := varintFieldSize(rlsStatusCode, uint64(st.code))
	if st.shape != nil {
		n += len(st.shape.limit)
	}
	if st.hasReset {
		n += varintFieldSize(rlsLimitRemaining, uint64(st.remaining))
		n += nestedSize(rlsUntilReset, varintFieldSize(1, uint64(st.secs))+varintFieldSize(2, uint64(st.nanos)))
	}
	return n
}

// resetParts splits d as durationpb does: seconds, and nanoseconds of the
// same sign. A negative value is written as protobuf writes an int64 (ten
// bytes), an int32 as its sign extension.
func resetParts(d time.Duration) (secs int64, nanos int32) {
	return int64(d / time.Second), int32(d % time.Second)
}

// appendVarintField writes a proto3 scalar: nothing for its zero value.
func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}

func varintFieldSize(num protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(v)
}

// appendStringField writes a proto3 string: nothing for "".
func appendStringField(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), s)
}

func stringFieldSize(num protowire.Number, s string) int {
	if s == "" {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(len(s))
}

// nestedSize is the size of a message field whose message is n bytes
// (written even when empty: a set message field is present).
func nestedSize(num protowire.Number, n int) int {
	return protowire.SizeTag(num) + protowire.SizeBytes(n)
}
