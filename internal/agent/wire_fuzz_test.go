package agent

import (
	"bytes"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/ration-dev/ration/internal/rules"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// FuzzDecodeBatch holds decodeBatch to proto.Unmarshal: for any bytes, both
// refuse them or both read the same requests (descriptors compared as
// maps, costs bit for bit).
func FuzzDecodeBatch(f *testing.F) {
	for _, m := range wireSeeds(f) {
		f.Add(m)
	}
	f.Fuzz(func(t *testing.T, wire []byte) {
		checkDecodeBatch(t, wire)
	})
}

// TestDecodeBatchSeeds runs the fuzz seeds on every `go test`, and names
// what each is for.
func TestDecodeBatchSeeds(t *testing.T) {
	for i, m := range wireSeeds(t) {
		t.Run(strconv.Itoa(i), func(t *testing.T) { checkDecodeBatch(t, m) })
	}
}

func checkDecodeBatch(t *testing.T, wire []byte) {
	t.Helper()
	var want rationv1.AllowBatchRequest
	werr := proto.Unmarshal(wire, &want)
	// Decoded twice into one batchWire: what a pooled one held before
	// must not show.
	var got batchWire
	if err := decodeBatch(wireSeeds(t)[1], &got); err != nil {
		t.Fatal(err)
	}
	got.reset()
	gerr := decodeBatch(append([]byte(nil), wire...), &got)
	if (werr == nil) != (gerr == nil) {
		t.Fatalf("% x: proto.Unmarshal error %v, decodeBatch error %v", wire, werr, gerr)
	}
	if werr != nil {
		return
	}
	if got.n != len(want.Requests) {
		t.Fatalf("% x: %d requests, proto.Unmarshal read %d", wire, got.n, len(want.Requests))
	}
	for i, pr := range want.Requests {
		if i >= MaxBatch {
			break
		}
		checkSameRequest(t, wire, i, fromProto(pr), got.reqs[i])
	}
}

// checkSameRequest fails unless g, request i decoded from wire, is w as
// proto.Unmarshal and fromProto read it.
func checkSameRequest(t *testing.T, wire []byte, i int, w, g Request) {
	t.Helper()
	{
		gd := g.Descriptors
		if g.pairs != nil {
			if gd != nil {
				t.Fatalf("request %d has both pairs and a map", i)
			}
			gd = map[string]string{}
			for _, p := range g.pairs {
				if _, dup := gd[p.Key]; dup {
					t.Fatalf("request %d: key %q twice in its pairs", i, p.Key)
				}
				gd[p.Key] = p.Value
			}
			if len(g.pairs) > rules.MaxDescriptors {
				t.Fatalf("request %d: %d pairs, more than %d", i, len(g.pairs), rules.MaxDescriptors)
			}
		}
		if !maps.Equal(gd, w.Descriptors) || g.Rule != w.Rule || g.Subject != w.Subject || g.RequestID != w.RequestID ||
			math.Float64bits(g.Cost) != math.Float64bits(w.Cost) {
			t.Fatalf("% x: request %d decoded as %+v, proto.Unmarshal read %+v", wire, i, g, w)
		}
	}
}

// wireSeeds are AllowBatchRequests as a client writes them, and as one
// might not: fields repeated, unknown, of another wire type, groups,
// strings that are not UTF-8, more distinct keys than a request may have.
func wireSeeds(tb testing.TB) [][]byte {
	tb.Helper()
	marshal := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			tb.Fatal(err)
		}
		return b
	}
	many := map[string]string{}
	for i := range rules.MaxDescriptors + 3 {
		many["k"+strconv.Itoa(i)] = "v"
	}
	batch := func(reqs ...[]byte) []byte {
		var b []byte
		for _, r := range reqs {
			b = protowire.AppendBytes(protowire.AppendTag(b, 1, protowire.BytesType), r)
		}
		return b
	}
	seeds := [][]byte{
		{},
		marshal(&rationv1.AllowBatchRequest{Requests: []*rationv1.AllowRequest{
			{Descriptors: map[string]string{"user": "u1", "endpoint": "search"}},
			{Rule: "r", Subject: "s", Cost: 2.5, RequestId: "id-1"},
			{},
			{Descriptors: many},
			{Descriptors: map[string]string{"": ""}, Cost: math.Inf(1)},
		}}),
		marshal(&rationv1.AllowBatchRequest{Requests: []*rationv1.AllowRequest{ // runs of one request, read once
			{Descriptors: map[string]string{"user": "u1"}}, {Descriptors: map[string]string{"user": "u1"}},
			{Descriptors: many}, {Descriptors: many},
			{Rule: "r", Subject: "s"}, {Rule: "r", Subject: "s"}, {Descriptors: map[string]string{"user": "u1"}},
		}}),
		append(batch(req(entry("x", "y"))), varint(2, 5)...), // an unknown batch field
		append(batch(req(entry("x", "y"))), 0x0a, 0x05, 'a'), // truncated
		protowire.AppendTag(nil, protowire.MaxValidNumber+1, protowire.VarintType),
		{0x08},
		{0x00},
	}
	for _, r := range oddRequests() {
		seeds = append(seeds, batch(r))
	}
	return seeds
}

// req is an AllowRequest's bytes: its fields' in turn.
func req(fields ...[]byte) []byte {
	var b []byte
	for _, f := range fields {
		b = append(b, f...)
	}
	return b
}

// str is a string field, varint a varint field, entry a descriptors entry.
func str(num protowire.Number, s string) []byte {
	return protowire.AppendString(protowire.AppendTag(nil, num, protowire.BytesType), s)
}

func varint(num protowire.Number, v uint64) []byte {
	return protowire.AppendVarint(protowire.AppendTag(nil, num, protowire.VarintType), v)
}

func entry(k, v string) []byte { return str(1, string(append(str(1, k), str(2, v)...))) }

// oddRequests are AllowRequests as a client might not write them: fields
// repeated, of another wire type, groups, strings that are not UTF-8. Both
// decoders' seeds hold them (a batch's each in a batch of one).
func oddRequests() [][]byte {
	return [][]byte{
		req(entry("a", "1"), entry("b", "2"), entry("a", "3")),    // the last "a" wins
		req(str(2, "r1"), str(2, "r2"), str(3, "s")),              // so does the last rule
		req(varint(1, 7), varint(2, 1), str(9, "unknown")),        // known fields of another type are skipped
		req(str(1, string(append(varint(1, 3), str(2, "v")...)))), // an entry whose key is a varint
		req(str(2, "\xff")), // not UTF-8
		req(entry("k", "\xfe")),
		req(protowire.AppendTag(nil, 7, protowire.StartGroupType), protowire.AppendTag(nil, 7, protowire.EndGroupType)),
		req(protowire.AppendTag(nil, 7, protowire.EndGroupType)),
	}
}

// FuzzDecodeAllowWire holds decodeAllow, the server's reading of a unary
// Allow, to proto.Unmarshal as FuzzDecodeBatch holds decodeBatch.
func FuzzDecodeAllowWire(f *testing.F) {
	for _, m := range allowSeeds(f) {
		f.Add(m)
	}
	f.Fuzz(func(t *testing.T, wire []byte) {
		checkDecodeAllow(t, wire)
	})
}

// TestDecodeAllowSeeds runs FuzzDecodeAllowWire's seeds on every go test.
func TestDecodeAllowSeeds(t *testing.T) {
	for i, m := range allowSeeds(t) {
		t.Run(strconv.Itoa(i), func(t *testing.T) { checkDecodeAllow(t, m) })
	}
}

func checkDecodeAllow(t *testing.T, wire []byte) {
	t.Helper()
	var want rationv1.AllowRequest
	werr := proto.Unmarshal(wire, &want)
	// Decoded twice into one allowWire, released between: what a pooled
	// one held before must not show.
	got := new(allowWire)
	if err := decodeAllow(allowSeeds(t)[1], got); err != nil {
		t.Fatal(err)
	}
	got.release()
	gerr := decodeAllow(append([]byte(nil), wire...), got)
	if (werr == nil) != (gerr == nil) {
		t.Fatalf("% x: proto.Unmarshal error %v, decodeAllow error %v", wire, werr, gerr)
	}
	if gerr != nil {
		if !strings.Contains(gerr.Error(), "AllowRequest") || strings.Contains(gerr.Error(), "AllowBatchRequest") {
			t.Fatalf("% x: decodeAllow error %q does not name AllowRequest", wire, gerr)
		}
		return
	}
	checkSameRequest(t, wire, 0, fromProto(&want), got.req)
}

// allowSeeds are AllowRequests as clients write them, and as they might
// not (see wireSeeds).
func allowSeeds(tb testing.TB) [][]byte {
	tb.Helper()
	marshal := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			tb.Fatal(err)
		}
		return b
	}
	many := map[string]string{}
	for i := range rules.MaxDescriptors + 3 {
		many["k"+strconv.Itoa(i)] = "v"
	}
	return append([][]byte{
		{},
		marshal(&rationv1.AllowRequest{Descriptors: map[string]string{"user": "u1", "endpoint": "search"}}),
		marshal(&rationv1.AllowRequest{Rule: "r", Subject: "s", Cost: 2.5, RequestId: "id-1"}),
		marshal(&rationv1.AllowRequest{Descriptors: many}),
		marshal(&rationv1.AllowRequest{Descriptors: map[string]string{"": ""}, Cost: math.Inf(1)}),
		append(req(entry("x", "y")), 0x0a, 0x05, 'a'), // truncated
		protowire.AppendTag(nil, protowire.MaxValidNumber+1, protowire.VarintType),
		{0x08},
		{0x00},
	}, oddRequests()...)
}

// TestAllowAnswerEncoding: a unary Allow's answer as the codec writes it
// (allowAnswer) is byte for byte what proto.Marshal writes of the
// AllowResponse grpcServer.Allow makes of the same decision.
func TestAllowAnswerEncoding(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	durs := []time.Duration{0, 1, time.Millisecond, time.Millisecond + 1, time.Hour, -time.Second, math.MaxInt64}
	floats := []float64{0, math.Copysign(0, -1), 0.5, 1, 127.9, 1e6, 1e300, math.Inf(1), math.Inf(-1), math.NaN(), -3}
	strs := []string{"", "r", strings.Repeat("y", 127), strings.Repeat("z", 300), "ünï"}
	c := newCodec()
	for round := range 500 {
		r := Response{
			Allowed: rng.IntN(2) == 0, RetryAfter: durs[rng.IntN(len(durs))], Remaining: floats[rng.IntN(len(floats))],
			Limit: floats[rng.IntN(len(floats))], Rate: floats[rng.IntN(len(floats))], Reset: durs[rng.IntN(len(durs))],
			Rule: strs[rng.IntN(len(strs))], Reason: Reason(rng.IntN(int(ReasonEmergency) + 1)),
		}
		pr := &rationv1.AllowResponse{}
		toProto(r, pr)
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(pr)
		if err != nil {
			t.Fatal(err)
		}
		bs, err := c.Marshal(&allowAnswer{answerFrom(&r, nil)}) // released to the pool
		if err != nil {
			t.Fatal(err)
		}
		got := bs.Materialize()
		bs.Free()
		if !bytes.Equal(got, want) {
			t.Fatalf("round %d: %+v: codec wrote\n% x\nproto.Marshal\n% x", round, r, got, want)
		}
	}
}

// TestBatchResponseEncoding: the codec writes AllowBatch's answers byte for
// byte as proto.Marshal does, for values of every size and sign.
func TestBatchResponseEncoding(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	ints := []int64{0, 1, -1, 127, 128, 1 << 20, math.MaxInt64, math.MinInt64, math.MaxInt64 / 2}
	floats := []float64{0, math.Copysign(0, -1), 1, 0.5, math.Inf(1), math.NaN(), 1e300}
	strs := []string{"", "r", strings.Repeat("x", 127), strings.Repeat("y", 128), strings.Repeat("z", 20000), "ünï"}
	pick := func(v []int64) int64 {
		if rng.IntN(3) == 0 {
			return rng.Int64() - rng.Int64()
		}
		return v[rng.IntN(len(v))]
	}
	c := newCodec()
	for round := range 300 {
		r := &rationv1.AllowBatchResponse{}
		for range rng.IntN(20) {
			r.Responses = append(r.Responses, &rationv1.AllowResponse{
				Allowed: rng.IntN(2) == 0, RetryAfterMs: pick(ints), Remaining: pick(ints), Limit: pick(ints),
				ResetMs: pick(ints), Rule: strs[rng.IntN(len(strs))], Reason: rationv1.Reason(rng.IntN(9) - 1),
				Error: strs[rng.IntN(len(strs))], Rate: floats[rng.IntN(len(floats))],
			})
		}
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		bs, err := c.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		got := bs.Materialize()
		bs.Free()
		if !bytes.Equal(got, want) {
			t.Fatalf("round %d: codec wrote\n% x\nproto.Marshal\n% x", round, got, want)
		}
		if size := batchResponseSize(r); size != len(want) {
			t.Fatalf("round %d: size %d, written %d", round, size, len(want))
		}
	}
}

// TestDecidedEncoding: AllowBatch's answers written from the decisions
// (appendDecided) are byte for byte what proto.Marshal writes of the
// AllowBatchResponse allowBatch makes of the same decisions, for values
// of every size, long rule names and errors (lengths past one byte).
func TestDecidedEncoding(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	durs := []time.Duration{0, 1, time.Millisecond, time.Millisecond + 1, time.Hour, -time.Second, math.MaxInt64}
	floats := []float64{0, math.Copysign(0, -1), 0.5, 1, 127.9, 1e6, 1e300, math.Inf(1), math.Inf(-1), math.NaN(), -3}
	strs := []string{"", "r", strings.Repeat("x", 100), strings.Repeat("y", 127), strings.Repeat("z", 300), "ünï"}
	c := newCodec()
	for round := range 500 {
		n := rng.IntN(30)
		d := getDecided(n)
		want := &rationv1.AllowBatchResponse{}
		for i := range n {
			d.resps[i] = Response{
				Allowed: rng.IntN(2) == 0, RetryAfter: durs[rng.IntN(len(durs))], Remaining: floats[rng.IntN(len(floats))],
				Limit: floats[rng.IntN(len(floats))], Rate: floats[rng.IntN(len(floats))], Reset: durs[rng.IntN(len(durs))],
				Rule: strs[rng.IntN(len(strs))], Reason: Reason(rng.IntN(int(ReasonEmergency) + 1)),
			}
			d.errs[i] = nil
			pr := &rationv1.AllowResponse{}
			if rng.IntN(5) == 0 {
				d.errs[i] = fmt.Errorf("%w: %s", ErrInvalidRequest, strs[rng.IntN(len(strs))])
				pr.Reason, pr.Error = rationv1.Reason_REASON_INVALID, d.errs[i].Error()
			} else {
				toProto(d.resps[i], pr)
			}
			want.Responses = append(want.Responses, pr)
		}
		wb, err := proto.MarshalOptions{Deterministic: true}.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		bs, err := c.Marshal(d) // releases d
		if err != nil {
			t.Fatal(err)
		}
		got := bs.Materialize()
		bs.Free()
		if !bytes.Equal(got, wb) {
			t.Fatalf("round %d: codec wrote\n% x\nproto.Marshal\n% x", round, got, wb)
		}
	}
}
