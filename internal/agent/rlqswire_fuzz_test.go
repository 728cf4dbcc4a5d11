package agent

import (
	"errors"
	"strconv"
	"testing"
	"unicode/utf8"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// FuzzDecodeRLQS holds decodeRLQS to proto.Unmarshal: for any bytes, both
// read the same report (unknown fields aside), or both refuse them as
// malformed, or proto.Unmarshal refuses a string that is not UTF-8 and
// decodeRLQS keeps it in the report, for rlqs to refuse; and the codec
// then reads the report as protobuf does, but for that string.
func FuzzDecodeRLQS(f *testing.F) {
	for _, m := range rlqsSeeds(f) {
		f.Add(m)
	}
	f.Fuzz(func(t *testing.T, wire []byte) {
		checkDecodeRLQS(t, wire)
	})
}

// TestDecodeRLQSSeeds runs the fuzz seeds on every `go test`.
func TestDecodeRLQSSeeds(t *testing.T) {
	for i, m := range rlqsSeeds(t) {
		t.Run(strconv.Itoa(i), func(t *testing.T) { checkDecodeRLQS(t, m) })
	}
}

func checkDecodeRLQS(t *testing.T, wire []byte) {
	t.Helper()
	var want rlqsv3.RateLimitQuotaUsageReports
	werr := proto.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(wire, &want)
	var u interface{ InvalidUTF8() bool }
	wantUTF8 := werr != nil && errors.As(werr, &u) && u.InvalidUTF8()
	// Read into a report that held another: nothing of it must show.
	var got rlqsv3.RateLimitQuotaUsageReports
	if err := decodeRLQS(rlqsSeeds(t)[1], &got); err != nil {
		t.Fatal(err)
	}
	gerr := decodeRLQS(append([]byte(nil), wire...), &got)
	switch {
	case wantUTF8:
		if !errors.Is(gerr, errWireUTF8) || !notUTF8(&got) {
			t.Fatalf("% x: proto.Unmarshal: %v; decodeRLQS: %v, kept a string not UTF-8: %v", wire, werr, gerr, notUTF8(&got))
		}
	case werr != nil:
		if !errors.Is(gerr, errWireRLQS) {
			t.Fatalf("% x: proto.Unmarshal: %v; decodeRLQS: %v", wire, werr, gerr)
		}
	case gerr != nil:
		t.Fatalf("% x: proto.Unmarshal read it, decodeRLQS: %v", wire, gerr)
	case !proto.Equal(&got, &want):
		t.Fatalf("% x: decodeRLQS read\n%v\nproto.Unmarshal\n%v", wire, &got, &want)
	}
	// The codec: protobuf's reading, or the report kept for rlqs.
	var c rlqsv3.RateLimitQuotaUsageReports
	cerr := newCodec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(append([]byte(nil), wire...))}, &c)
	switch {
	case wantUTF8:
		if cerr != nil || !notUTF8(&c) {
			t.Fatalf("% x: the codec: %v, kept a string not UTF-8: %v", wire, cerr, notUTF8(&c))
		}
	case (werr == nil) != (cerr == nil):
		t.Fatalf("% x: proto.Unmarshal: %v; the codec: %v", wire, werr, cerr)
	}
}

// notUTF8 reports whether a string of r is not UTF-8.
func notUTF8(r *rlqsv3.RateLimitQuotaUsageReports) bool {
	if !utf8.ValidString(r.GetDomain()) {
		return true
	}
	for _, u := range r.GetBucketQuotaUsages() {
		for k, v := range u.GetBucketId().GetBucket() {
			if !utf8.ValidString(k) || !utf8.ValidString(v) {
				return true
			}
		}
	}
	return false
}

// rlqsSeeds are usage reports as Envoy writes them, and as one might not:
// fields repeated (messages merged, the last scalar winning), unknown, of
// another wire type, groups, truncated; strings that are not UTF-8 in the
// domain, a key, a value, a value before its key, a key given again after
// a bad one, a bad string followed by a malformed field.
func rlqsSeeds(tb testing.TB) [][]byte {
	tb.Helper()
	marshal := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			tb.Fatal(err)
		}
		return b
	}
	tag := protowire.AppendTag
	field := func(b []byte, num protowire.Number, v []byte) []byte {
		return protowire.AppendBytes(tag(b, num, protowire.BytesType), v)
	}
	kv := func(k, v string) []byte { return field(field(nil, 1, []byte(k)), 2, []byte(v)) }
	id := func(entries ...[]byte) []byte {
		var b []byte
		for _, e := range entries {
			b = field(b, 1, e)
		}
		return b
	}
	usage := func(id []byte, rest ...byte) []byte { return append(field(nil, 1, id), rest...) }
	report := func(domain string, us ...[]byte) []byte {
		b := field(nil, 1, []byte(domain))
		for _, u := range us {
			b = field(b, 2, u)
		}
		return b
	}
	varint := func(num protowire.Number, v uint64) []byte {
		return protowire.AppendVarint(tag(nil, num, protowire.VarintType), v)
	}
	return [][]byte{
		nil,
		marshal(&rlqsv3.RateLimitQuotaUsageReports{Domain: "edge", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			{BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": "acme", "path": "/a"}}, TimeElapsed: durationpb.New(1500000000), NumRequestsAllowed: 7, NumRequestsDenied: 2},
			{BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": "b"}}},
		}}),
		report("edge", usage(id(kv("tenant", "\xff\xfe")))),                                                   // a bad value
		report("edge", usage(id(kv("ten\xc3ant", "acme")))),                                                   // a bad key
		report("ed\x80ge", usage(id(kv("tenant", "acme")))),                                                   // a bad domain
		report("", usage(id(append(field(nil, 2, []byte{0xed, 0xa0, 0x80}), field(nil, 1, []byte("k"))...)))), // a surrogate value, then its key
		report("e", usage(id(append(kv("\xff", "v"), field(nil, 1, []byte("good"))...)))),                     // a bad key, then a good one
		report("e", usage(id(kv("k", "\xff"), kv("k", "ok")))),                                                // a bad value, then the key again
		report("e", usage(id(append(kv("k", "\xff"), 0x12)))),                                                 // a bad value, then a truncated field in its entry
		append(report("e", usage(id(kv("k", "\xff")))), 0x12),                                                 // a bad value, then a truncated field
		append(field(nil, 1, []byte{0xff}), field(nil, 1, []byte("b"))...),                                    // a bad domain, then a good one
		report("a", usage(id(kv("k", "v"))), usage(id(kv("k", "v")))),                                         // one bucket twice (rlqs refuses it)
		field(nil, 2, append(usage(id(kv("a", "1"))), field(nil, 1, id(kv("b", "2"), kv("a", "3")))...)),      // bucket_id twice: merged
		field(nil, 2, append(field(nil, 2, varint(1, 5)), field(nil, 2, varint(2, 9))...)),                    // time_elapsed twice: merged
		field(nil, 2, append(varint(3, 1), varint(3, 1<<40)...)),                                              // the last count wins
		field(nil, 2, field(nil, 2, varint(2, 1<<40))),                                                        // nanos past 32 bits
		field(nil, 2, varint(1, 3)),                                                                           // bucket_id as a varint: unknown
		varint(1, 3),                                                                                          // domain as a varint: unknown
		field(nil, 2, field(nil, 1, varint(1, 3))),                                                            // a bucket entry as a varint: unknown
		field(nil, 2, field(nil, 1, field(nil, 1, varint(1, 3)))),                                             // an entry's key as a varint: unknown
		field(field(nil, 7, []byte("x")), 2, field(nil, 9, nil)),                                              // unknown fields
		append(tag(nil, 9, protowire.StartGroupType), tag(nil, 9, protowire.EndGroupType)...),                 // a group
		tag(nil, 9, protowire.EndGroupType),                                                                   // an end without a start
		field(nil, 2, []byte{0x0a, 0x05, 0x0a}),                                                               // a truncated bucket_id
		field(nil, 2, field(nil, 1, []byte{0x0a, 0x02, 0x0a})),                                                // a truncated entry
		{0x80},
	}
}
