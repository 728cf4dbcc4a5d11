package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"unicode/utf8"
	"unsafe"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ration-dev/ration/internal/rules"
)

// Envoy's ShouldRateLimit is read from the wire by decodeRLS and answered
// by rlsAnswer.append, as Allow is (wire.go): with protobuf's generic code
// both ways, and a Go map of descriptors per request, the same decision
// cost the agent 1.28 times Allow's CPU. decodeRLS accepts exactly what
// proto.Unmarshal accepts and reads the same values from it
// (FuzzDecodeRLS), and rlsAnswer writes what proto.Marshal writes of
// toEnvoy's message (TestRLSAnswerEncoding). The generated interface's
// ShouldRateLimit stays for in-process callers, reading the message
// through the same rlsWire.

// errWireRLS is a malformed RateLimitRequest; gRPC answers it with
// codes.Internal, as it does proto.Unmarshal's errors.
var errWireRLS = errors.New("agent: malformed RateLimitRequest")

// errRLSUTF8 is the caller's bad input (INVALID_ARGUMENT, as the agent's
// own API and HTTP answer the same bytes), not a message gRPC failed to
// read (INTERNAL).
var errRLSUTF8 = fmt.Errorf("%w: RateLimitRequest: a string (the domain, or a descriptor entry's key or value) is not valid UTF-8", ErrInvalidRequest)

// rlsWire is Envoy's RateLimitRequest as the agent reads it.
type rlsWire struct {
	domain string
	hits   uint32 // the request's hits_addend
	descs  []rlsDescriptor
	// pairs backs the descriptors' entries, in the order given (a key may
	// repeat: rlsRequests decides what that means).
	pairs rules.Pairs
	// invalid: a string is not UTF-8; nothing is to be decided, the
	// answer is InvalidArgument.
	invalid error
	// reqs and reqPairs are rlsRequests' output, kept for reuse.
	reqs     []Request
	reqPairs rules.Pairs
}

// rlsDescriptor is one RateLimitDescriptor: its entries are
// pairs[first:first+n] of its rlsWire.
type rlsDescriptor struct {
	first, n int
	limit    bool   // a limit override is present
	hitsSet  bool   // hits_addend is present
	hits     uint64 // hits_addend's value
	negative bool   // is_negative_hits
}

var rlsWires sync.Pool // of *rlsWire

func getRLSWire() *rlsWire {
	if w, _ := rlsWires.Get().(*rlsWire); w != nil {
		return w
	}
	return new(rlsWire)
}

// release returns w to rlsWires once its call is answered, its strings
// (which point into the message) cleared.
func (w *rlsWire) release() {
	if cap(w.pairs) > 4*rules.MaxDescriptors || cap(w.descs) > MaxEnvoyDescriptors {
		return
	}
	w.reset()
	rlsWires.Put(w)
}

func (w *rlsWire) reset() {
	clear(w.pairs)
	clear(w.reqs)
	clear(w.reqPairs)
	*w = rlsWire{descs: w.descs[:0], pairs: w.pairs[:0], reqs: w.reqs[:0], reqPairs: w.reqPairs[:0]}
}

// decodeRLS reads a RateLimitRequest into w (reset). buf must not change
// afterwards: every string points into it. The first string that is not
// UTF-8 ends the reading, as in proto.Unmarshal, and is kept in
// w.invalid; any other malformation is the error.
func decodeRLS(buf []byte, w *rlsWire) error {
	err := w.decode(buf)
	if errors.Is(err, errWireUTF8) {
		w.invalid = errRLSUTF8
		return nil
	}
	return err
}

func (w *rlsWire) decode(buf []byte) error {
	m := unsafe.String(unsafe.SliceData(buf), len(buf))
	for off := 0; off < len(m); {
		b := buf[off:]
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return errWireRLS
		}
		off += n
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType: // domain
			v, n := bytesField(m, off, b)
			if n < 0 {
				return errWireRLS
			}
			if !utf8.ValidString(v) {
				return errWireUTF8
			}
			w.domain = v
			off += n
		case num == 2 && typ == protowire.BytesType: // descriptors
			v, n := bytesField(m, off, b)
			if n < 0 {
				return errWireRLS
			}
			if err := w.decodeDescriptor(v); err != nil {
				return err
			}
			off += n
		case num == 3 && typ == protowire.VarintType: // hits_addend
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return errWireRLS
			}
			w.hits = uint32(v)
			off += n
		default:
			n, err := skipField(num, typ, b)
			if err != nil {
				return errWireRLS
			}
			off += n
		}
	}
	return nil
}

// decodeDescriptor reads one RateLimitDescriptor from d, a part of the
// message, appending it to w.
func (w *rlsWire) decodeDescriptor(d string) error {
	desc := rlsDescriptor{first: len(w.pairs)}
	for off := 0; off < len(d); {
		b := unsafe.Slice(unsafe.StringData(d[off:]), len(d)-off)
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return errWireRLS
		}
		off += n
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType: // entries
			e, n := bytesField(d, off, b)
			if n < 0 {
				return errWireRLS
			}
			k, val, err := decodeEntry(e)
			switch {
			case errors.Is(err, errWireUTF8):
				return errWireUTF8
			case err != nil:
				return errWireRLS
			}
			w.pairs = append(w.pairs, rules.Pair{Key: k, Value: val})
			off += n
		case num == 2 && typ == protowire.BytesType: // limit
			v, n := protowire.ConsumeBytes(b)
			if n < 0 || !validOverride(v) {
				return errWireRLS
			}
			desc.limit = true
			off += n
		case num == 3 && typ == protowire.BytesType: // hits_addend (UInt64Value)
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return errWireRLS
			}
			// A message given twice is merged: a value in the later one
			// replaces the earlier, an empty one keeps it.
			val, set, ok := wrapperValue(v)
			if !ok {
				return errWireRLS
			}
			desc.hitsSet = true
			if set {
				desc.hits = val
			}
			off += n
		case num == 4 && typ == protowire.VarintType: // is_negative_hits
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return errWireRLS
			}
			desc.negative = v != 0
			off += n
		default:
			n, err := skipField(num, typ, b)
			if err != nil {
				return errWireRLS
			}
			off += n
		}
	}
	desc.n = len(w.pairs) - desc.first
	w.descs = append(w.descs, desc)
	return nil
}

// validOverride reports whether b is a well-formed RateLimitOverride
// (requests_per_unit 1, unit 2, unit_multiplier 3 a UInt32Value): the
// agent refuses any override, but proto.Unmarshal reads it first.
func validOverride(b []byte) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		if num == 3 && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return false
			}
			if _, _, ok := wrapperValue(v); !ok {
				return false
			}
			b = b[n:]
			continue
		}
		n, err := skipField(num, typ, b)
		if err != nil {
			return false
		}
		b = b[n:]
	}
	return true
}

// wrapperValue reads a UInt64Value or UInt32Value (field 1, a varint; a
// UInt32Value keeps the low 32 bits, which its callers here do not read).
func wrapperValue(b []byte) (v uint64, set, ok bool) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, false, false
		}
		b = b[n:]
		if num == 1 && typ == protowire.VarintType {
			x, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return 0, false, false
			}
			v, set = x, true
			b = b[n:]
			continue
		}
		n, err := skipField(num, typ, b)
		if err != nil {
			return 0, false, false
		}
		b = b[n:]
	}
	return v, set, true
}

// rlsFromProto reads an in-process caller's message into w (reset), as
// decodeRLS reads its bytes.
func rlsFromProto(r *rlsv3.RateLimitRequest, w *rlsWire) {
	w.domain, w.hits = r.GetDomain(), r.GetHitsAddend()
	bad := !utf8.ValidString(w.domain)
	for _, d := range r.GetDescriptors() {
		desc := rlsDescriptor{first: len(w.pairs), limit: d.GetLimit() != nil, negative: d.GetIsNegativeHits()}
		if h := d.GetHitsAddend(); h != nil {
			desc.hitsSet, desc.hits = true, h.GetValue()
		}
		for _, e := range d.GetEntries() {
			w.pairs = append(w.pairs, rules.Pair{Key: e.GetKey(), Value: e.GetValue()})
			bad = bad || !utf8.ValidString(e.GetKey()) || !utf8.ValidString(e.GetValue())
		}
		desc.n = len(w.pairs) - desc.first
		w.descs = append(w.descs, desc)
	}
	if bad {
		w.invalid = errRLSUTF8
	}
}

// rlsRequests turns w's descriptors into one Request each (in w.reqs):
// its entries are the descriptors, plus EnvoyDomainKey set to the
// domain. A key given twice with different values, or a domain entry
// that differs from the domain, is an invalid request. Cost is the
// descriptor's hits_addend when set and positive, else the request's
// hits_addend when positive, else 1.
func (w *rlsWire) rlsRequests() ([]Request, error) {
	switch {
	case len(w.descs) == 0:
		return nil, fmt.Errorf("%w: no descriptors", ErrInvalidRequest)
	case len(w.descs) > MaxEnvoyDescriptors:
		return nil, fmt.Errorf("%w: %d descriptors, at most %d", ErrInvalidRequest, len(w.descs), MaxEnvoyDescriptors)
	}
	reqs, out := w.reqs[:0], w.reqPairs[:0]
	firsts := make([]int, 0, 4)
	for i, d := range w.descs {
		if d.limit {
			return nil, fmt.Errorf("%w: descriptor %d: limit overrides are not supported: limits come from the agent's rules file", ErrInvalidRequest, i)
		}
		if d.negative {
			return nil, fmt.Errorf("%w: descriptor %d: is_negative_hits is not supported", ErrInvalidRequest, i)
		}
		first := len(out)
		if w.domain != "" {
			out = append(out, rules.Pair{Key: EnvoyDomainKey, Value: w.domain})
		}
		for _, en := range w.pairs[d.first : d.first+d.n] {
			k, v := en.Key, en.Value
			if j := pairIndex(out[first:], k); j >= 0 {
				old := out[first+j].Value
				if old == v {
					continue
				}
				if k == EnvoyDomainKey && old == w.domain {
					return nil, fmt.Errorf("%w: descriptor %d: entry %q = %q conflicts with the request's domain %q (the domain is passed as descriptor %q; rename the entry's descriptor_key)",
						ErrInvalidRequest, i, k, truncate(v), truncate(w.domain), EnvoyDomainKey)
				}
				return nil, fmt.Errorf("%w: descriptor %d: key %q given twice with different values (give each Envoy action its own descriptor_key)", ErrInvalidRequest, i, truncate(k))
			}
			out = append(out, en)
		}
		cost := 1.0
		switch {
		case d.hitsSet && d.hits > 0:
			cost = float64(d.hits)
		case w.hits > 0:
			cost = float64(w.hits)
		}
		var req Request
		req.Cost = cost
		if len(out)-first > rules.MaxDescriptors {
			// Only its refusal reads it (it says how many there were).
			req.Descriptors = make(map[string]string, len(out)-first)
			for _, p := range out[first:] {
				req.Descriptors[p.Key] = p.Value
			}
			out = out[:first]
		}
		reqs = append(reqs, req)
		firsts = append(firsts, first)
	}
	// The pairs are sliced once all are appended: out may have moved.
	for i := range reqs {
		end := len(out)
		if i+1 < len(firsts) {
			end = firsts[i+1]
		}
		if reqs[i].Descriptors == nil && end > firsts[i] {
			reqs[i].pairs = out[firsts[i]:end:end]
		}
	}
	w.reqs, w.reqPairs = reqs, out
	return reqs, nil
}

// envoyServiceDesc is rlsv3's service with ShouldRateLimit read as an
// rlsWire and answered as an rlsAnswer.
func envoyServiceDesc() *grpc.ServiceDesc {
	desc := rlsv3.RateLimitService_ServiceDesc
	desc.Methods = append([]grpc.MethodDesc(nil), desc.Methods...)
	for i := range desc.Methods {
		if desc.Methods[i].MethodName == "ShouldRateLimit" {
			desc.Methods[i].Handler = shouldRateLimitHandler
		}
	}
	return &desc
}

func shouldRateLimitHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	in := getRLSWire()
	defer in.release()
	if err := dec(in); err != nil {
		return nil, err
	}
	e := srv.(*envoyServer)
	// The answer goes to the codec as *rlsAnswer (codec.Marshal). A nil
	// *rlsAnswer must not become a non-nil any beside an error.
	answer := func(ctx context.Context, w *rlsWire) (any, error) {
		a, err := e.decide(ctx, w)
		if err != nil {
			return nil, err
		}
		return a, nil
	}
	return intercept(ctx, srv, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, in, interceptor, answer)
}

// decide decides every descriptor of w, answering as rlsAnswer.
func (e *envoyServer) decide(ctx context.Context, w *rlsWire) (*rlsAnswer, error) {
	if w.invalid != nil {
		e.svc.metrics.invalid.Inc()
		return nil, status.Error(codes.InvalidArgument, w.invalid.Error())
	}
	reqs, err := w.rlsRequests()
	if err != nil {
		e.svc.metrics.invalid.Inc()
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	a := newRLSAnswer(len(reqs))
	if err := e.svc.decideAll(ctx, reqs, a.out); err != nil {
		a.release()
		return nil, grpcError(err)
	}
	if err := a.plan(); err != nil {
		a.release()
		return nil, err
	}
	return a, nil
}
