package agent

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ration-dev/ration/internal/rules"
)

// FuzzDecodeRLS holds decodeRLS to proto.Unmarshal: for any bytes, both
// refuse them alike (malformed, or a string that is not UTF-8) or both
// read the same request (rlsFromProto of proto.Unmarshal's message), and
// rlsRequests then makes the same Requests, or the same error, of both.
func FuzzDecodeRLS(f *testing.F) {
	for _, m := range rlsSeeds(f) {
		f.Add(m)
	}
	f.Fuzz(func(t *testing.T, wire []byte) {
		checkDecodeRLS(t, wire)
	})
}

// TestDecodeRLSSeeds runs the fuzz seeds on every `go test`.
func TestDecodeRLSSeeds(t *testing.T) {
	for i, m := range rlsSeeds(t) {
		t.Run(strconv.Itoa(i), func(t *testing.T) { checkDecodeRLS(t, m) })
	}
}

func checkDecodeRLS(t *testing.T, wire []byte) {
	t.Helper()
	var msg rlsv3.RateLimitRequest
	werr := proto.Unmarshal(wire, &msg)
	var u interface{ InvalidUTF8() bool }
	wantUTF8 := werr != nil && errors.As(werr, &u) && u.InvalidUTF8()
	// Decoded twice into one rlsWire: what a pooled one held before must
	// not show.
	got := getRLSWire()
	defer got.release()
	if err := decodeRLS(rlsSeeds(t)[1], got); err != nil {
		t.Fatal(err)
	}
	if _, err := got.rlsRequests(); err != nil {
		t.Fatal(err)
	}
	got.reset()
	gerr := decodeRLS(append([]byte(nil), wire...), got)
	switch {
	case wantUTF8:
		if gerr != nil || got.invalid == nil {
			t.Fatalf("% x: proto.Unmarshal: %v; decodeRLS: error %v, invalid %v, want the UTF-8 refusal", wire, werr, gerr, got.invalid)
		}
		return
	case (werr == nil) != (gerr == nil):
		t.Fatalf("% x: proto.Unmarshal error %v, decodeRLS error %v", wire, werr, gerr)
	case werr != nil:
		return
	case got.invalid != nil:
		t.Fatalf("% x: decodeRLS refused a string proto.Unmarshal took: %v", wire, got.invalid)
	}
	want := getRLSWire()
	defer want.release()
	rlsFromProto(&msg, want)
	if got.domain != want.domain || got.hits != want.hits || !slices.Equal(got.descs, want.descs) || !slices.Equal(got.pairs, want.pairs) {
		t.Fatalf("% x: decodeRLS read\n%+v %+v\nproto.Unmarshal\n%+v %+v", wire, got.descs, got.pairs, want.descs, want.pairs)
	}
	greqs, gerr := got.rlsRequests()
	wreqs, werr := want.rlsRequests()
	if (gerr == nil) != (werr == nil) || gerr != nil && gerr.Error() != werr.Error() {
		t.Fatalf("% x: rlsRequests: %v, from proto.Unmarshal's message %v", wire, gerr, werr)
	}
	for i := range wreqs {
		checkSameRequest(t, wire, i, asMap(wreqs[i]), greqs[i])
	}
}

// asMap is r with its descriptors in a map, as checkSameRequest wants.
func asMap(r Request) Request {
	if r.pairs != nil {
		r.Descriptors = map[string]string{}
		for _, p := range r.pairs {
			r.Descriptors[p.Key] = p.Value
		}
		r.pairs = nil
	}
	return r
}

// rlsSeeds are RateLimitRequests as Envoy writes them, and as one might
// not: fields repeated, unknown, of another wire type, groups, limit
// overrides good and bad, hits_addend wrappers merged, strings that are
// not UTF-8, keys repeated with the same or another value, the domain
// given again as an entry, more keys and descriptors than allowed.
func rlsSeeds(tb testing.TB) [][]byte {
	tb.Helper()
	marshal := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			tb.Fatal(err)
		}
		return b
	}
	entry := func(k, v string) *ratelimitv3.RateLimitDescriptor_Entry {
		return &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: v}
	}
	desc := func(es ...*ratelimitv3.RateLimitDescriptor_Entry) *ratelimitv3.RateLimitDescriptor {
		return &ratelimitv3.RateLimitDescriptor{Entries: es}
	}
	req := func(domain string, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds}
	}
	tag := func(b []byte, num protowire.Number, typ protowire.Type) []byte {
		return protowire.AppendTag(b, num, typ)
	}
	field := func(b []byte, num protowire.Number, v []byte) []byte {
		return protowire.AppendBytes(tag(b, num, protowire.BytesType), v)
	}
	many := desc()
	for i := range rules.MaxDescriptors + 3 {
		many.Entries = append(many.Entries, entry("k"+strconv.Itoa(i), "v"))
	}
	var manyDescs []*ratelimitv3.RateLimitDescriptor
	for range MaxEnvoyDescriptors + 1 {
		manyDescs = append(manyDescs, desc(entry("user", "u")))
	}
	one := marshal(desc(entry("user", "alice")))
	hits := func(v uint64) []byte { return marshal(wrapperspb.UInt64(v)) }
	seeds := [][]byte{
		nil,
		marshal(req("edge", desc(entry("user", "alice"), entry("path", "/a")))),
		marshal(req("", desc(entry("user", "alice")), desc(entry("ip", "10.0.0.1")))),
		marshal(&rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 7, Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{entry("user", "a")}, HitsAddend: wrapperspb.UInt64(3)},
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{entry("user", "b")}, HitsAddend: wrapperspb.UInt64(0)},
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{entry("user", "c")}, IsNegativeHits: true},
		}}),
		marshal(req("edge", &ratelimitv3.RateLimitDescriptor{Entries: one2(entry("user", "a")),
			Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: 1, UnitMultiplier: wrapperspb.UInt32(2)}})),
		marshal(req("edge", desc(entry("user", "a"), entry("user", "a")))),                    // same value twice: fine
		marshal(req("edge", desc(entry("user", "a"), entry("user", "b")))),                    // another value: refused
		marshal(req("edge", desc(entry("domain", "edge")))),                                   // the domain again: fine
		marshal(req("edge", desc(entry("domain", "other")))),                                  // conflicts with the domain
		marshal(req("", desc(entry("domain", "x"), entry("domain", "y")))),                    // no domain, repeated key
		marshal(req("edge", many)),                                                            // more keys than a request may have
		marshal(req("edge", manyDescs...)),                                                    // more descriptors than allowed
		marshal(req("edge", desc())),                                                          // no entries
		marshal(req("edge")),                                                                  // no descriptors
		marshal(req("edge", desc(entry("", "")), desc(entry("k", "")))),                       // empty strings
		field(field(nil, 1, []byte("a")), 1, []byte("b")),                                     // domain twice: the last wins
		field(field(nil, 1, []byte{0xff}), 1, []byte("b")),                                    // a bad domain, then a good one
		field(nil, 1, []byte{0xc3, 0x28}),                                                     // not UTF-8
		field(nil, 2, field(nil, 1, field(nil, 1, []byte{0xed, 0xa0, 0x80}))),                 // a surrogate key
		field(nil, 2, field(nil, 1, field(field(nil, 1, []byte("k")), 2, []byte{0x80}))),      // a bad value
		append(field(nil, 1, []byte{0xff}), 0x12),                                             // bad UTF-8, then a truncated field
		field(nil, 2, append(field(nil, 3, hits(5)), field(nil, 3, nil)...)),                  // hits_addend merged: 5 stays
		field(nil, 2, append(field(nil, 3, hits(5)), field(nil, 3, hits(9))...)),              // the later value wins
		field(nil, 2, field(nil, 3, []byte{0x08})),                                            // a truncated wrapper
		field(nil, 2, field(nil, 2, []byte{0x1a, 0x02, 0x08})),                                // a truncated override's multiplier
		field(nil, 2, field(nil, 2, field(nil, 3, field(nil, 9, nil)))),                       // an override's multiplier with an unknown field
		protowire.AppendVarint(tag(nil, 2, protowire.VarintType), 5),                          // descriptors as a varint: unknown
		protowire.AppendVarint(tag(nil, 3, protowire.BytesType), 0),                           // hits_addend as bytes: unknown
		protowire.AppendVarint(tag(nil, 3, protowire.VarintType), 1<<40),                      // hits_addend past 32 bits
		field(nil, 2, protowire.AppendVarint(tag(one, 4, protowire.VarintType), 2)),           // is_negative_hits = 2
		append(tag(nil, 9, protowire.StartGroupType), tag(nil, 9, protowire.EndGroupType)...), // a group
		tag(nil, 9, protowire.EndGroupType),                                                   // an end without a start
		tag(nil, 9, protowire.StartGroupType),
		field(nil, 2, append(one, tag(nil, 7, protowire.Fixed32Type)...)), // a truncated unknown field
		{0x80},
	}
	return seeds
}

func one2(es ...*ratelimitv3.RateLimitDescriptor_Entry) []*ratelimitv3.RateLimitDescriptor_Entry {
	return es
}

// TestRLSAnswerEncoding: the codec writes ShouldRateLimit's answer byte for
// byte as proto.Marshal writes toEnvoy's message, for one descriptor and
// several, every reason, and values of every size and sign; and both fail
// the call alike (UNAVAILABLE) when a descriptor cannot be decided and
// none is over limit.
func TestRLSAnswerEncoding(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	durs := []time.Duration{0, 1, time.Millisecond, time.Second + 1, time.Hour, -time.Second, math.MaxInt64}
	floats := []float64{0, 0.5, 1, 127.9, 1e6, 1e300, math.Inf(1), math.NaN(), -3}
	strs := []string{"", "r", strings.Repeat("y", 127), strings.Repeat("z", 300), "ünï"}
	c := newCodec()
	for round := range 1000 {
		out := make([]Response, 1+rng.IntN(3))
		for i := range out {
			out[i] = Response{
				Allowed: rng.IntN(2) == 0, RetryAfter: durs[rng.IntN(len(durs))], Remaining: floats[rng.IntN(len(floats))],
				Limit: floats[rng.IntN(len(floats))], Rate: floats[rng.IntN(len(floats))], Reset: durs[rng.IntN(len(durs))],
				Rule: strs[rng.IntN(len(strs))], Reason: Reason(rng.IntN(int(ReasonEmergency) + 1)),
			}
		}
		msg, werr := toEnvoy(out)
		a := newRLSAnswer(len(out))
		copy(a.out, out)
		gerr := a.plan()
		if (werr == nil) != (gerr == nil) || werr != nil && werr.Error() != gerr.Error() {
			t.Fatalf("round %d: %+v: toEnvoy error %v, rlsAnswer error %v", round, out, werr, gerr)
		}
		if werr != nil {
			a.release()
			continue
		}
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		if n := a.size(); n != len(want) {
			t.Fatalf("round %d: size %d, proto.Marshal wrote %d bytes", round, n, len(want))
		}
		bs, err := c.Marshal(a) // released to the pool
		if err != nil {
			t.Fatal(err)
		}
		got := bs.Materialize()
		bs.Free()
		if !bytes.Equal(got, want) {
			t.Fatalf("round %d: %+v: codec wrote\n% x\nproto.Marshal\n% x", round, out, got, want)
		}
	}
}
