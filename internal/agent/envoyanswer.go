package agent

import (
	"math"
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
	st.perUnit = uint32(min(floorInt(o.Limit), math.MaxUint32))
	if w := quotaOf(o).Window(); w > 0 {
		st.window = uint32(min(w, math.MaxUint32))
	}
	if o.Reason != ReasonUnavailable { // else no bucket was read
		st.hasReset = true
		st.remaining = uint32(min(floorInt(o.Remaining), math.MaxUint32))
		st.reset = o.Reset
	}
	return st
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
// them (fields in number order, zero values left out).
type rlsAnswer struct {
	out    []Response
	one    [1]Response
	over   bool
	fields []header.Field
}

var rlsAnswers sync.Pool // of *rlsAnswer

func newRLSAnswer(n int) *rlsAnswer {
	a, _ := rlsAnswers.Get().(*rlsAnswer)
	if a == nil {
		a = new(rlsAnswer)
	}
	a.out = a.one[:]
	if n > 1 {
		a.out = make([]Response, n)
	}
	return a
}

func (a *rlsAnswer) release() {
	*a = rlsAnswer{}
	rlsAnswers.Put(a)
}

// plan settles the overall code and the header fields once out is
// decided, or the call's error.
func (a *rlsAnswer) plan() error {
	overLimit, err := envoyVerdict(a.out)
	if err != nil {
		return err
	}
	var retryAfter time.Duration
	if overLimit >= 0 {
		a.over = true
		retryAfter = envoyRetryAfter(a.out)
	}
	var qbuf [4]header.Quota
	a.fields = header.Fields(retryAfter, envoyQuotas(a.out, qbuf[:0])...)
	return nil
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

func (a *rlsAnswer) append(b []byte) []byte {
	code := rlsv3.RateLimitResponse_OK
	if a.over {
		code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	b = appendVarintField(b, rlsOverallCode, uint64(code))
	for _, o := range a.out {
		st := statusOf(o)
		b = protowire.AppendTag(b, rlsStatuses, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(st.size()))
		b = st.append(b)
	}
	for _, f := range a.fields {
		b = protowire.AppendTag(b, rlsHeadersToAdd, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(headerSize(f)))
		b = appendStringField(b, rlsHeaderKey, f.Name)
		b = appendStringField(b, rlsHeaderValue, f.Value)
	}
	return b
}

func (a *rlsAnswer) size() int {
	code := rlsv3.RateLimitResponse_OK
	if a.over {
		code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	n := varintFieldSize(rlsOverallCode, uint64(code))
	for _, o := range a.out {
		n += nestedSize(rlsStatuses, statusOf(o).size())
	}
	for _, f := range a.fields {
		n += nestedSize(rlsHeadersToAdd, headerSize(f))
	}
	return n
}

func (st rlsStatus) append(b []byte) []byte {
	b = appendVarintField(b, rlsStatusCode, uint64(st.code))
	if st.hasLimit {
		b = protowire.AppendTag(b, rlsCurrentLimit, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(st.limitSize()))
		b = appendVarintField(b, rlsPerUnit, uint64(st.perUnit))
		if st.window > 0 {
			b = appendVarintField(b, rlsUnit, uint64(rlsv3.RateLimitResponse_RateLimit_SECOND))
		}
		b = appendStringField(b, rlsName, st.name)
		if st.window > 0 {
			b = protowire.AppendTag(b, rlsUnitMultiplier, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(varintFieldSize(1, uint64(st.window))))
			b = appendVarintField(b, 1, uint64(st.window))
		}
	}
	if st.hasReset {
		b = appendVarintField(b, rlsLimitRemaining, uint64(st.remaining))
		secs, nanos := resetParts(st.reset)
		b = protowire.AppendTag(b, rlsUntilReset, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(varintFieldSize(1, uint64(secs))+varintFieldSize(2, uint64(nanos))))
		b = appendVarintField(b, 1, uint64(secs))
		b = appendVarintField(b, 2, uint64(nanos))
	}
	return b
}

func (st rlsStatus) size() int {
	n := varintFieldSize(rlsStatusCode, uint64(st.code))
	if st.hasLimit {
		n += nestedSize(rlsCurrentLimit, st.limitSize())
	}
	if st.hasReset {
		n += varintFieldSize(rlsLimitRemaining, uint64(st.remaining))
		secs, nanos := resetParts(st.reset)
		n += nestedSize(rlsUntilReset, varintFieldSize(1, uint64(secs))+varintFieldSize(2, uint64(nanos)))
	}
	return n
}

func (st rlsStatus) limitSize() int {
	n := varintFieldSize(rlsPerUnit, uint64(st.perUnit)) + stringFieldSize(rlsName, st.name)
	if st.window > 0 {
		n += varintFieldSize(rlsUnit, uint64(rlsv3.RateLimitResponse_RateLimit_SECOND))
		n += nestedSize(rlsUnitMultiplier, varintFieldSize(1, uint64(st.window)))
	}
	return n
}

// resetParts splits d as durationpb does: seconds, and nanoseconds of the
// same sign. A negative value is written as protobuf writes an int64 (ten
// bytes), an int32 as its sign extension.
func resetParts(d time.Duration) (secs int64, nanos int32) {
	return int64(d / time.Second), int32(d % time.Second)
}

func headerSize(f header.Field) int {
	return stringFieldSize(rlsHeaderKey, f.Name) + stringFieldSize(rlsHeaderValue, f.Value)
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
