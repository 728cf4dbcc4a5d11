package agent

import (
	"context"
	"strconv"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/rules"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// BenchmarkHandlers measures what the agent does per call on top of the
// store, for unary Allow and for Envoy's ShouldRateLimit carrying the same
// one descriptor: the request decoded from its wire bytes, decided (on the
// in-memory store, so no round trip is in the figure) and the answer
// encoded, as the gRPC server's codec and handler do. The difference
// between the two is what Envoy's API costs over Ration's own.
//
// allow-server is the same call as the server makes it: Allow's request
// read and its answer written by the agent's codec (wire.go), not by
// protobuf's reflection.
//
//	go test -run '^$' -bench Handlers -benchmem ./internal/agent/
func BenchmarkHandlers(b *testing.B) {
	set, err := rules.Parse("bench.yaml", []byte(`
rules:
  - name: per-user
    match: {user: "*"}
    burst: 1000000000
    rate: 1000000000
`))
	if err != nil {
		b.Fatal(err)
	}
	svc, err := New(Options{Rules: StaticRules{Set: set}, Store: bucket.NewMemoryStore(nil), DecisionTimeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	const keys = 1000
	allow := make([][]byte, keys)
	envoy := make([][]byte, keys)
	for i := range keys {
		u := "u" + strconv.Itoa(i)
		if allow[i], err = proto.Marshal(&rationv1.AllowRequest{Descriptors: map[string]string{"user": u}}); err != nil {
			b.Fatal(err)
		}
		if envoy[i], err = proto.Marshal(&rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*commonrl.RateLimitDescriptor{{
			Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "user", Value: u}},
		}}}); err != nil {
			b.Fatal(err)
		}
	}
	g, e := &grpcServer{svc: svc}, &envoyServer{svc: svc}
	b.Run("allow", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			r := new(rationv1.AllowRequest)
			if err := proto.Unmarshal(allow[i%keys], r); err != nil {
				b.Fatal(err)
			}
			resp, err := g.Allow(ctx, r)
			if err != nil || !resp.GetAllowed() {
				b.Fatalf("Allow = %v, %v", resp, err)
			}
			if _, err := proto.Marshal(resp); err != nil {
				b.Fatal(err)
			}
		}
	})
	// allow as the server runs it (allowHandler): its codec reads the
	// request (decodeAllow) and writes the answer.
	b.Run("allow-server", func(b *testing.B) {
		b.ReportAllocs()
		c := newCodec()
		i := 0
		for b.Loop() {
			i++
			dec := func(v any) error { return c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(allow[i%keys])}, v) }
			a, err := allowHandler(g, ctx, dec, nil)
			if err != nil || !a.(*allowAnswer).allowed {
				b.Fatalf("Allow = %v, %v", a, err)
			}
			bs, err := c.Marshal(a)
			if err != nil {
				b.Fatal(err)
			}
			bs.Free()
		}
	})
	b.Run("envoy", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			r := new(rlsv3.RateLimitRequest)
			if err := proto.Unmarshal(envoy[i%keys], r); err != nil {
				b.Fatal(err)
			}
			resp, err := e.ShouldRateLimit(ctx, r)
			if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				b.Fatalf("ShouldRateLimit = %v, %v", resp, err)
			}
			if _, err := proto.Marshal(resp); err != nil {
				b.Fatal(err)
			}
		}
	})
	// envoy as the server runs it (shouldRateLimitHandler): its codec
	// reads the request (decodeRLS) and writes the answer (rlsAnswer).
	b.Run("envoy-server", func(b *testing.B) {
		b.ReportAllocs()
		c := newCodec()
		i := 0
		for b.Loop() {
			i++
			dec := func(v any) error { return c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(envoy[i%keys])}, v) }
			a, err := shouldRateLimitHandler(e, ctx, dec, nil)
			if err != nil || a.(*rlsAnswer).over {
				b.Fatalf("ShouldRateLimit = %v, %v", a, err)
			}
			bs, err := c.Marshal(a)
			if err != nil {
				b.Fatal(err)
			}
			bs.Free()
		}
	})

	// AllowBatch of 1000 on a leased rule, one subject (the make bench row
	// "leased: AllowBatch of 1000, 1 hot key"): all in memory, from a
	// lease big enough never to run dry.
	lset, err := rules.Parse("leased.yaml", []byte(`
rules:
  - name: hot
    match: {leased: "*"}
    burst: 1000000000000
    rate: 1000000000000
    mode: leased
    lease: {period: 30s}
`))
	if err != nil {
		b.Fatal(err)
	}
	lsvc, err := New(Options{Rules: StaticRules{Set: lset}, Store: bucket.NewMemoryStore(nil),
		Leases: harness.DevLeases(b, lset), DecisionTimeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	batch := &rationv1.AllowBatchRequest{}
	for range 1000 {
		batch.Requests = append(batch.Requests, &rationv1.AllowRequest{Descriptors: map[string]string{"leased": "k"}})
	}
	wire, err := proto.Marshal(batch)
	if err != nil {
		b.Fatal(err)
	}
	lg := &grpcServer{svc: lsvc}
	if _, err := lsvc.Decide(ctx, Request{Descriptors: map[string]string{"leased": "k"}}); err != nil {
		b.Fatal(err) // the first decision waits for the grant
	}
	b.Run("leased-batch=1000", func(b *testing.B) {
		b.ReportAllocs()
		// As the server does it: its codec (wire.go) reads the request
		// and writes the answer.
		c := newCodec()
		for b.Loop() {
			bw, _ := wirePool.Get().(*batchWire)
			if bw == nil {
				bw = new(batchWire)
			}
			if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, bw); err != nil {
				b.Fatal(err)
			}
			d, err := lg.decideBatch(ctx, bw.reqs, bw.n)
			bw.release()
			if err != nil || !d.resps[999].Allowed {
				b.Fatalf("AllowBatch = %v", err)
			}
			out, err := c.Marshal(d) // written from the decisions, and released, as the server's handler has it
			if err != nil {
				b.Fatal(err)
			}
			out.Free()
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*1000), "ns/decision")
	})
}
