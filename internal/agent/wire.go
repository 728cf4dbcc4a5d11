package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"unicode/utf8"
	"unsafe"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ration-dev/ration/internal/rules"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// AllowBatch's request is read from the wire by decodeBatch rather than by
// protobuf's generic decoder, which builds a Go map per request for its
// descriptors, a string per key and value, and a message per request:
// about 40% of the agent's CPU in a leased batch of 1000. decodeBatch
// makes the requests in one slice, their descriptors as rules.Pairs in
// another, and their strings share one copy of the message. It accepts
// exactly what proto.Unmarshal accepts and reads the same values from it
// (FuzzDecodeBatch holds it to that, byte string by byte string): unknown
// fields and known fields of another wire type are skipped, the last of
// a repeated scalar wins, so does the last entry of a repeated map key,
// and strings must be UTF-8.

// errWire is a malformed message; gRPC answers it with codes.Internal, as it
// does proto.Unmarshal's errors.
var errWire = errors.New("agent: malformed AllowBatchRequest")

// errWireUTF8 is a string field that is not UTF-8, which proto3 refuses.
// It comes as a *wireUTF8Error naming the field (wireinvalid.go).
var errWireUTF8 = errors.New("string is not valid UTF-8")

// batchWire is AllowBatch's request as decodeBatch reads it.
type batchWire struct {
	reqs []Request
	// n counts every request in the message, also those past MaxBatch,
	// which are checked but not kept: the handler refuses the batch.
	n int
	// pairs backs the requests' descriptors.
	pairs rules.Pairs
	// invalid: a request's string is not UTF-8; the batch is refused
	// with InvalidArgument naming it (wireinvalid.go).
	invalid error
}

var wirePool sync.Pool // of *batchWire

// release returns bw to wirePool once its batch is answered. Its slices are
// cleared: their strings point into the message, which is not kept.
func (bw *batchWire) release() {
	if cap(bw.pairs) > 4*MaxBatch { // a batch of many descriptors each: not kept
		return
	}
	bw.reset()
	wirePool.Put(bw)
}

func (bw *batchWire) reset() {
	clear(bw.reqs)
	clear(bw.pairs)
	*bw = batchWire{reqs: bw.reqs[:0], pairs: bw.pairs[:0]}
}

// decodeBatch reads an AllowBatchRequest into bw (whose slices it reuses).
// buf must not change afterwards: descriptor keys and values point into
// it (they are read while deciding and never kept: subjects and bucket
// keys are new strings), while a request's rule, subject and request id,
// which the agent keeps (a leased quota's name, the record of request
// ids), are copied out of it.
func decodeBatch(buf []byte, bw *batchWire) error {
	bw.reqs, bw.n = bw.reqs[:0], 0
	if len(buf) == 0 {
		return nil
	}
	s := unsafe.String(&buf[0], len(buf))
	// Counted first, when bw is new, so that the requests are allocated
	// once; a pooled bw has room from its last batch (counting every batch
	// was a tenth of a leased batch's decoding), and grows if need be. A
	// request usually has a descriptor or two.
	if cap(bw.reqs) == 0 {
		bw.reqs = room(bw.reqs, min(countRequests(buf), MaxBatch))
	}
	// One backing array for the batch's descriptors.
	pairs := rules.Pairs(room(bw.pairs, min(len(buf)/4, 2*cap(bw.reqs))))
	defer func() { bw.pairs = pairs }() // also on an error, for release to clear
	// The bytes of the last request decoded: a request written the same
	// (a batch of one hot key) is a copy of it, read once.
	var last string
	for off := 0; off < len(s); {
		num, typ, n := protowire.ConsumeTag(buf[off:])
		if n < 0 {
			return errWire
		}
		off += n
		if num == 1 && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(buf[off:])
			if n < 0 {
				return errWire
			}
			start := off + n - len(v)
			off += n
			if msg := s[start:off]; len(bw.reqs) > 0 && msg == last {
				if bw.n < MaxBatch {
					req := bw.reqs[len(bw.reqs)-1]
					req.repeat = true
					bw.reqs = append(bw.reqs, req)
				}
				bw.n++
				continue
			}
			last = s[start:off]
			var req Request
			var err error
			before := len(pairs)
			req, pairs, err = decodeRequest(s[start:off], pairs)
			if err != nil {
				return inRequest(bw.n, err)
			}
			if bw.n < MaxBatch {
				bw.reqs = append(bw.reqs, req)
			} else {
				pairs = pairs[:before]
			}
			bw.n++
			continue
		}
		if n, err := skipField(num, typ, buf[off:]); err != nil {
			return err
		} else {
			off += n
		}
	}
	// The requests' pairs were appended to one slice that may have moved
	// as it grew: point each request at its part of the final array.
	at := 0
	for i := range bw.reqs {
		if bw.reqs[i].repeat {
			bw.reqs[i].pairs = bw.reqs[i-1].pairs // the same part as the request it copies
			continue
		}
		if k := len(bw.reqs[i].pairs); bw.reqs[i].pairs != nil {
			bw.reqs[i].pairs = pairs[at : at+k : at+k]
			at += k
		}
	}
	return nil
}

// countRequests counts the requests field's occurrences in a batch,
// stopping at anything malformed (decodeBatch then finds it).
func countRequests(b []byte) int {
	k := 0
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return k
		}
		b = b[n:]
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return k
		}
		b = b[n:]
		if num == 1 && typ == protowire.BytesType {
			k++
		}
	}
	return k
}

// skipField skips an unknown field's value as proto.Unmarshal does (an
// end-group tag where no group is open is an error).
func skipField(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
	if typ == protowire.EndGroupType || num > protowire.MaxValidNumber {
		return 0, errWire
	}
	n := protowire.ConsumeFieldValue(num, typ, b)
	if n < 0 {
		return 0, errWire
	}
	return n, nil
}

// decodeRequest reads one AllowRequest from m (a part of the batch's
// string), appending its descriptors to pairs. The request's pairs field
// is left with the right length but pointing anywhere: decodeBatch sets
// it once every request is read. A request with more distinct keys than
// rules.MaxDescriptors gets a map instead, which only its refusal reads
// (it reports how many there were).
func decodeRequest(m string, pairs rules.Pairs) (Request, rules.Pairs, error) {
	var req Request
	first := len(pairs)
	var many map[string]string
	for off := 0; off < len(m); {
		b := unsafe.Slice(unsafe.StringData(m[off:]), len(m)-off)
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return req, pairs, errWire
		}
		off += n
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType: // descriptors entry
			entry, n := bytesField(m, off, b)
			if n < 0 {
				return req, pairs, errWire
			}
			off += n
			k, val, err := decodeEntry(entry)
			if err != nil {
				return req, pairs, err
			}
			if many != nil {
				many[k] = val
				continue
			}
			if i := pairIndex(pairs[first:], k); i >= 0 {
				pairs[first+i].Value = val
				continue
			}
			if len(pairs)-first == rules.MaxDescriptors {
				many = make(map[string]string, rules.MaxDescriptors+1)
				for _, p := range pairs[first:] {
					many[p.Key] = p.Value
				}
				many[k] = val
				pairs = pairs[:first]
				continue
			}
			pairs = append(pairs, rules.Pair{Key: k, Value: val})
		case (num == 2 || num == 3 || num == 5) && typ == protowire.BytesType:
			str, n := bytesField(m, off, b)
			if n < 0 {
				return req, pairs, errWire
			}
			off += n
			if !utf8.ValidString(str) {
				return req, pairs, &wireUTF8Error{field: requestFields[num]}
			}
			str = strings.Clone(str)
			switch num {
			case 2:
				req.Rule = str
			case 3:
				req.Subject = str
			default:
				req.RequestID = str
			}
		case num == 4 && typ == protowire.Fixed64Type:
			v, n := protowire.ConsumeFixed64(b)
			if n < 0 {
				return req, pairs, errWire
			}
			off += n
			req.Cost = math.Float64frombits(v)
		default:
			n, err := skipField(num, typ, b)
			if err != nil {
				return req, pairs, err
			}
			off += n
		}
	}
	switch {
	case many != nil:
		req.Descriptors = many
	case len(pairs) > first:
		req.pairs = pairs[first:len(pairs):len(pairs)]
	}
	return req, pairs, nil
}

// bytesField reads the length-delimited value at b, which is m[off:]: the
// value as a part of m (no copy), and the bytes read (n < 0: malformed).
func bytesField(m string, off int, b []byte) (string, int) {
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return "", n
	}
	return m[off+n-len(v) : off+n], n
}

// decodeEntry reads a map entry (and Envoy's descriptor Entry, the same
// shape): key 1 and value 2, both strings, each missing one empty, the
// last of each given winning. A string that is not UTF-8 ends the
// reading, as in proto.Unmarshal (entryUTF8Error names it).
func decodeEntry(e string) (k, v string, err error) { return readEntry(e, false) }

// readEntry is decodeEntry; with keep, the first string that is not
// UTF-8 is kept rather than refused at once: the entry is read to its
// end (a value's key may come after it), no later string replaces it,
// and the error is errWireUTF8, what proto.Unmarshal would have said
// first, whatever follows. Its caller refuses the entry, naming its key
// (decodeRLQS).
func readEntry(e string, keep bool) (k, v string, err error) {
	var bad protowire.Number // the field of the kept string, if any
	for off := 0; off < len(e); {
		b := unsafe.Slice(unsafe.StringData(e[off:]), len(e)-off)
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return badEntry(k, v, bad, errWire)
		}
		off += n
		b = b[n:]
		if (num == 1 || num == 2) && typ == protowire.BytesType {
			str, n := bytesField(e, off, b)
			if n < 0 {
				return badEntry(k, v, bad, errWire)
			}
			off += n
			if num == bad {
				continue
			}
			if !utf8.ValidString(str) {
				if !keep {
					return "", "", entryUTF8Error(num == 1, k, str)
				}
				if bad == 0 {
					bad = num
				}
			}
			if num == 1 {
				k = str
			} else {
				v = str
			}
			continue
		}
		n, err := skipField(num, typ, b)
		if err != nil {
			return badEntry(k, v, bad, err)
		}
		off += n
	}
	return badEntry(k, v, bad, nil)
}

// badEntry is readEntry's answer: errWireUTF8 once a string was kept
// (bad), whatever else went wrong after it; err otherwise.
func badEntry(k, v string, bad protowire.Number, err error) (string, string, error) {
	switch {
	case bad != 0:
		return k, v, errWireUTF8
	case err != nil:
		return "", "", err
	}
	return k, v, nil
}

func pairIndex(p rules.Pairs, k string) int {
	for i := range p {
		if p[i].Key == k {
			return i
		}
	}
	return -1
}

// codec is the agent's gRPC codec: protobuf's, except that a batchWire is
// read by decodeBatch.
type codec struct{ encoding.CodecV2 }

func newCodec() codec { return codec{encoding.GetCodecV2(proto.Name)} }

// Marshal writes AllowBatch's answer itself (appendBatchResponse); the
// rest goes to protobuf.
func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	switch r := v.(type) {
	case *allowAnswer: // the answer of allowHandler or allowStreamHandler
		bp := answerBufs.Get(r.size())
		*bp = r.append((*bp)[:0])
		r.release()
		return mem.BufferSlice{mem.NewBuffer(bp, answerBufs)}, nil
	case *decided: // allowBatchHandler's answer
		bp := answerBufs.Get(decidedSize(r))
		*bp = appendDecided((*bp)[:0], r)
		r.release()
		return mem.BufferSlice{mem.NewBuffer(bp, answerBufs)}, nil
	case *rlsAnswer: // shouldRateLimitHandler's answer
		bp := answerBufs.Get(r.size())
		*bp = r.append((*bp)[:0])
		r.release()
		return mem.BufferSlice{mem.NewBuffer(bp, answerBufs)}, nil
	case *rationv1.AllowBatchResponse:
		bp := answerBufs.Get(batchResponseSize(r))
		*bp = appendBatchResponse((*bp)[:0], r)
		return mem.BufferSlice{mem.NewBuffer(bp, answerBufs)}, nil
	}
	return c.CodecV2.Marshal(v)
}

// answerBufs holds the buffers AllowBatch's answers are written in. gRPC's
// own pool zeroes every buffer it hands out, which for an answer written
// over in full was a tenth of a leased batch's CPU.
var answerBufs = &bytePool{}

// bytePool is a mem.BufferPool whose buffers come back as they were left.
type bytePool struct{ p sync.Pool }

func (bp *bytePool) Get(n int) *[]byte {
	if b, _ := bp.p.Get().(*[]byte); b != nil && cap(*b) >= n {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n)
	return &b
}

func (bp *bytePool) Put(b *[]byte) {
	if cap(*b) <= 4<<20 { // an answer of MaxBatch items fits
		bp.p.Put(b)
	}
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	// A copy the requests' descriptors may point into: the buffers go
	// back to gRPC's pool when this returns.
	switch w := v.(type) {
	case *batchWire:
		return invalidString(decodeBatch(data.Materialize(), w), &w.invalid)
	case *allowWire:
		return invalidString(decodeAllow(data.Materialize(), w), &w.invalid)
	case *rlsWire:
		w.reset()
		return decodeRLS(data.Materialize(), w)
	case *rlqsv3.RateLimitQuotaUsageReports:
		return c.unmarshalRLQS(data, w)
	}
	return c.CodecV2.Unmarshal(data, v)
}

// serviceDesc is rationv1.RateLimiter_ServiceDesc with the requests of
// Allow and AllowStream read as allowWires and AllowBatch's as a batchWire.
func serviceDesc() *grpc.ServiceDesc {
	desc := rationv1.RateLimiter_ServiceDesc
	desc.Methods = append([]grpc.MethodDesc(nil), desc.Methods...)
	for i := range desc.Methods {
		switch desc.Methods[i].MethodName {
		case "Allow":
			desc.Methods[i].Handler = allowHandler
		case "AllowBatch":
			desc.Methods[i].Handler = allowBatchHandler
		}
	}
	desc.Streams = append([]grpc.StreamDesc(nil), desc.Streams...)
	for i := range desc.Streams {
		if desc.Streams[i].StreamName == "AllowStream" {
			desc.Streams[i].Handler = allowStreamHandler
		}
	}
	return &desc
}

// Allow's request is read by decodeRequest too, and its answer written by
// answer.append: a unary call then builds no Go map of descriptors and no
// protobuf message either way, which in process was 16 allocations and
// 1000 B per call (BenchmarkHandlers). AllowStream's messages are read
// and written the same way (allowStreamHandler). grpcServer.Allow and
// grpcServer.AllowStream, the generated interface's methods, stay for
// in-process callers; the server does not call them.

// allowWire is Allow's request as decodeAllow reads it.
type allowWire struct {
	req   Request
	pairs rules.Pairs // backs req's descriptors
	// invalid: a string is not UTF-8; req is not to be decided, the
	// answer is InvalidArgument naming the field (wireinvalid.go).
	invalid error
}

var allowWires sync.Pool // of *allowWire

// release returns aw to allowWires once its call is answered, its strings
// (which point into the message) cleared.
func (aw *allowWire) release() {
	if cap(aw.pairs) > rules.MaxDescriptors {
		return
	}
	clear(aw.pairs)
	*aw = allowWire{pairs: aw.pairs[:0]}
	allowWires.Put(aw)
}

// errWireAllow is Allow's own name for a malformed request.
var errWireAllow = errors.New("agent: malformed AllowRequest")

// decodeAllow reads an AllowRequest into aw, as decodeBatch reads each of
// a batch's: buf must not change afterwards (descriptors point into it).
func decodeAllow(buf []byte, aw *allowWire) error {
	req, pairs, err := decodeRequest(unsafe.String(unsafe.SliceData(buf), len(buf)), aw.pairs[:0])
	aw.pairs = pairs
	switch {
	case errors.Is(err, errWireUTF8):
		return fmt.Errorf("agent: AllowRequest: %w", err)
	case err != nil:
		return errWireAllow
	}
	aw.req = req
	return nil
}

func allowHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	in, _ := allowWires.Get().(*allowWire)
	if in == nil {
		in = new(allowWire)
	}
	defer in.release()
	if err := dec(in); err != nil {
		return nil, err
	}
	g := srv.(*grpcServer)
	// The answer goes to the codec as *allowAnswer (codec.Marshal). A nil
	// *allowAnswer must not become a non-nil any beside an error.
	answer := func(ctx context.Context, aw *allowWire) (any, error) {
		if aw.invalid != nil {
			g.svc.metrics.invalid.Inc()
			return nil, grpcError(aw.invalid)
		}
		resp, err := g.svc.Decide(ctx, aw.req)
		if err != nil {
			return nil, grpcError(err)
		}
		return newAllowAnswer(answerFrom(&resp, nil)), nil
	}
	return intercept(ctx, srv, rationv1.RateLimiter_Allow_FullMethodName, in, interceptor, answer)
}

// intercept runs answer on in through the server's interceptor, if any,
// as a generated handler does with its request.
func intercept[W any](ctx context.Context, srv any, method string, in W, interceptor grpc.UnaryServerInterceptor,
	answer func(context.Context, W) (any, error)) (any, error) {
	if interceptor == nil {
		return answer(ctx, in)
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: method}
	return interceptor(ctx, in, info, func(ctx context.Context, req any) (any, error) {
		return answer(ctx, req.(W))
	})
}

// allowStreamHandler is grpcServer.AllowStream with each request read as an
// allowWire and each answer written as an allowAnswer: the same answers,
// in order, a request's error in its own answer (REASON_INVALID).
func allowStreamHandler(srv any, stream grpc.ServerStream) error {
	g := srv.(*grpcServer)
	ctx := stream.Context()
	in := new(allowWire) // reused: each message replaces what it holds
	for {
		err := stream.RecvMsg(in)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		var resp Response
		derr := in.invalid
		if derr == nil {
			resp, derr = g.svc.Decide(ctx, in.req)
		} else {
			g.svc.metrics.invalid.Inc()
		}
		a := newAllowAnswer(answerFrom(&resp, derr))
		if err := stream.SendMsg(a); err != nil { // the codec releases a
			return err
		}
	}
}

// allowAnswer is the answer of allowHandler and allowStreamHandler: an
// AllowResponse's fields, which the codec writes as proto.Marshal would
// (TestAllowAnswerEncoding) and then releases.
type allowAnswer struct{ answer }

var allowAnswers sync.Pool // of *allowAnswer

func newAllowAnswer(a answer) *allowAnswer {
	x, _ := allowAnswers.Get().(*allowAnswer)
	if x == nil {
		x = new(allowAnswer)
	}
	x.answer = a
	return x
}

func (a *allowAnswer) release() {
	*a = allowAnswer{}
	allowAnswers.Put(a)
}

func allowBatchHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	in, _ := wirePool.Get().(*batchWire)
	if in == nil {
		in = new(batchWire)
	}
	defer in.release()
	if err := dec(in); err != nil {
		return nil, err
	}
	g := srv.(*grpcServer)
	// The answer goes to the codec as *decided (codec.Marshal). A nil
	// *decided must not become a non-nil any beside an error.
	answer := func(ctx context.Context, bw *batchWire) (any, error) {
		if bw.invalid != nil {
			g.svc.metrics.invalid.Inc()
			return nil, grpcError(bw.invalid)
		}
		d, err := g.decideBatch(ctx, bw.reqs, bw.n)
		if err != nil {
			return nil, err
		}
		return d, nil
	}
	return intercept(ctx, srv, rationv1.RateLimiter_AllowBatch_FullMethodName, in, interceptor, answer)
}

// appendBatchResponse appends r as proto.Marshal writes it (fields in
// number order, zero values left out), without protobuf's reflection:
// TestBatchResponseEncoding compares the bytes.
func appendBatchResponse(b []byte, r *rationv1.AllowBatchResponse) []byte {
	for _, x := range r.Responses {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(responseSize(x)))
		b = appendResponse(b, x)
	}
	return b
}

func batchResponseSize(r *rationv1.AllowBatchResponse) int {
	n := 0
	for _, x := range r.Responses {
		k := responseSize(x)
		n += 1 + protowire.SizeVarint(uint64(k)) + k
	}
	return n
}

// The tags of AllowResponse's fields, all below 16: one byte each.
const (
	tagAllowed    = 1<<3 | byte(protowire.VarintType)
	tagRetryAfter = 2<<3 | byte(protowire.VarintType)
	tagRemaining  = 3<<3 | byte(protowire.VarintType)
	tagLimit      = 4<<3 | byte(protowire.VarintType)
	tagReset      = 5<<3 | byte(protowire.VarintType)
	tagRule       = 6<<3 | byte(protowire.BytesType)
	tagReason     = 7<<3 | byte(protowire.VarintType)
	tagError      = 8<<3 | byte(protowire.BytesType)
	tagRate       = 9<<3 | byte(protowire.Fixed64Type)
)

// answer is one AllowResponse's fields as the wire carries them.
type answer struct {
	allowed                                     bool
	retryAfter, remaining, limit, reset, reason int64
	rule, err                                   string
	rate                                        float64
}

// answerOf is x's fields.
func answerOf(x *rationv1.AllowResponse) answer {
	return answer{
		allowed: x.Allowed, retryAfter: x.RetryAfterMs, remaining: x.Remaining, limit: x.Limit, reset: x.ResetMs,
		reason: int64(x.Reason), rule: x.Rule, err: x.Error, rate: x.Rate,
	}
}

// answerFrom is what allowBatch makes of a decision (toProto) or of a
// request's error.
func answerFrom(r *Response, err error) answer {
	if err != nil {
		return answer{reason: int64(rationv1.Reason_REASON_INVALID), err: err.Error()}
	}
	return answer{
		allowed: r.Allowed, retryAfter: ceilMillis(r.RetryAfter), remaining: floorInt(r.Remaining), limit: floorInt(r.Limit),
		reset: ceilMillis(r.Reset), reason: int64(reasonProto[r.Reason]), rule: r.Rule, rate: r.Rate,
	}
}

func (a *answer) append(b []byte) []byte {
	if a.allowed {
		b = append(b, tagAllowed, 1)
	}
	b = appendInt(b, tagRetryAfter, a.retryAfter)
	b = appendInt(b, tagRemaining, a.remaining)
	b = appendInt(b, tagLimit, a.limit)
	b = appendInt(b, tagReset, a.reset)
	b = appendStr(b, tagRule, a.rule)
	b = appendInt(b, tagReason, a.reason)
	b = appendStr(b, tagError, a.err)
	if bits := math.Float64bits(a.rate); bits != 0 {
		b = protowire.AppendFixed64(append(b, tagRate), bits)
	}
	return b
}

func (a *answer) size() int {
	n := 0
	if a.allowed {
		n += 2
	}
	n += intSize(a.retryAfter) + intSize(a.remaining) + intSize(a.limit) + intSize(a.reset) + intSize(a.reason)
	n += strSize(a.rule) + strSize(a.err)
	if math.Float64bits(a.rate) != 0 {
		n += 9
	}
	return n
}

func appendResponse(b []byte, x *rationv1.AllowResponse) []byte {
	a := answerOf(x)
	return a.append(b)
}

func responseSize(x *rationv1.AllowResponse) int {
	a := answerOf(x)
	return a.size()
}

// appendDecided appends d's answers as proto.Marshal writes the
// AllowBatchResponse allowBatch makes of them (TestDecidedEncoding).
// Each answer's length is written before it as one byte, made room for
// afterwards in the rare answer of 128 bytes or more (a long rule name,
// an error).
func appendDecided(b []byte, d *decided) []byte {
	for i := range d.resps {
		a := answerFrom(&d.resps[i], d.errs[i])
		b = append(b, 1<<3|byte(protowire.BytesType), 0)
		at := len(b)
		b = a.append(b)
		k := len(b) - at
		if k < 128 {
			b[at-1] = byte(k)
			continue
		}
		n := protowire.SizeVarint(uint64(k))
		b = append(b, make([]byte, n-1)...)
		copy(b[at-1+n:], b[at:at+k])
		protowire.AppendVarint(b[:at-1], uint64(k))
	}
	return b
}

// decidedSize is about the size appendDecided writes (exact unless an
// answer's fields are unusually large): the buffer it starts from.
func decidedSize(d *decided) int {
	n := 0
	for i := range d.resps {
		n += 2 + 2 + len(d.resps[i].Rule) + 4*4 + 2 + 9 + 4
		if d.errs[i] != nil {
			n += 128
		}
	}
	return n
}

func appendInt(b []byte, tag byte, v int64) []byte {
	if v == 0 {
		return b
	}
	// protowire.AppendVarint, unrolled for ten bytes, is a call; this
	// loop is inlined, and most values here take one to four bytes.
	b = append(b, tag)
	u := uint64(v)
	for u >= 0x80 {
		b = append(b, byte(u)|0x80)
		u >>= 7
	}
	return append(b, byte(u))
}

func intSize(v int64) int {
	if v == 0 {
		return 0
	}
	return 1 + protowire.SizeVarint(uint64(v))
}

func appendStr(b []byte, tag byte, s string) []byte {
	if s == "" {
		return b
	}
	return protowire.AppendString(append(b, tag), s)
}

func strSize(s string) int {
	if s == "" {
		return 0
	}
	return 1 + protowire.SizeBytes(len(s))
}
