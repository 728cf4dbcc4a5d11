//go:build unix

package main

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/agent"
)

// BenchmarkListenerTLS measures the CPU one call costs with the agent's
// listeners in plaintext, with -listen-tls and with -listen-client-auth,
// finely interleaved so that a shared machine's load weighs on the three
// alike: three in-process agents (memory store, the -dev rules) and this
// tool's own callers (64 per agent, over 4 gRPC connections or 64 HTTP/1.1
// ones, as ration-bench's defaults) take turns in slices of 100ms, in the opposite order in every
// other round; one op is one round. The CPU is this process's (getrusage):
// the agent's server side and the caller's client side of every call, so
// TLS's cost is counted on both ends, as it is spent.
//
// Reported per listener: the median over the rounds of the CPU per call
// (plain-us/call, tls-us/call, mtls-us/call), of each round's difference
// to its plaintext slice (tls-extra-us/call, mtls-extra-us/call) and of
// the calls per second. Runs of the whole agent processes, with Redis,
// are scripts/bench-tls.sh's; this is the part of them that the machine's
// noise hides there.
//
//	go test -run '^$' -bench ListenerTLS -benchtime 60x ./cmd/ration-bench/
func BenchmarkListenerTLS(b *testing.B) {
	p := newTestPKI(b)
	files := p.agentFiles()
	plain := startAgent(b, func(c *agent.Config) { c.TLS, c.AgentID = files, "bench" })
	tls := startAgent(b, func(c *agent.Config) { c.TLS, c.AgentID, c.ListenTLS = files, "bench", true })
	mtls := startAgent(b, func(c *agent.Config) {
		c.TLS, c.AgentID, c.ListenTLS, c.ListenClientAuth = files, "bench", true, true
	})
	for _, call := range []struct {
		name, flags string
		addr        func(*agent.Server) string
	}{
		{"empty", "-mode empty -target", (*agent.Server).GRPCAddr},
		{"allow", "-mode allow -keys 10000 -dist uniform -target", (*agent.Server).GRPCAddr},
		{"http", "-mode http -keys 10000 -dist uniform -http-target", (*agent.Server).HTTPAddr},
	} {
		b.Run("call="+call.name, func(b *testing.B) {
			ca := " -tls-ca " + p.file("ca.crt")
			listeners := []*sliceRunner{
				newSliceRunner(b, "plain", call.flags+" "+call.addr(plain)),
				newSliceRunner(b, "tls", call.flags+" "+call.addr(tls)+ca),
				newSliceRunner(b, "mtls", call.flags+" "+call.addr(mtls)+ca+" -tls-cert "+p.file("gateway.crt")+" -tls-key "+p.file("gateway.key")),
			}
			const slice = 100 * time.Millisecond
			for _, l := range listeners { // warm up: connections, handshakes, buckets
				l.run(b, slice)
			}
			for _, l := range listeners {
				l.cpu, l.rate = nil, nil
			}
			var extraTLS, extraMTLS []float64
			b.ResetTimer()
			for round := range b.N {
				order := listeners
				if round%2 == 1 {
					order = []*sliceRunner{listeners[2], listeners[1], listeners[0]}
				}
				for _, l := range order {
					l.run(b, slice)
				}
				extraTLS = append(extraTLS, listeners[1].last()-listeners[0].last())
				extraMTLS = append(extraMTLS, listeners[2].last()-listeners[0].last())
			}
			b.StopTimer()
			for _, l := range listeners {
				b.ReportMetric(median(l.cpu), l.name+"-us/call")
				b.ReportMetric(median(l.rate), l.name+"-calls/s")
			}
			b.ReportMetric(median(extraTLS), "tls-extra-us/call")
			b.ReportMetric(median(extraMTLS), "mtls-extra-us/call")
			b.ReportMetric(0, "ns/op") // one op is a round of three slices
		})
	}
}

// sliceRunner drives one agent for a slice at a time with ration-bench's
// own callers, and records each slice's CPU per call and calls per second.
type sliceRunner struct {
	name    string
	callers []caller
	cpu     []float64 // µs per call, one per slice
	rate    []float64 // calls per second, one per slice
}

func newSliceRunner(b *testing.B, name, args string) *sliceRunner {
	b.Helper()
	cfg, err := parseFlags(strings.Fields(args), &bytes.Buffer{})
	if err != nil {
		b.Fatalf("%s: ration-bench %s: %v", name, args, err)
	}
	d, err := dial(context.Background(), cfg)
	if err != nil {
		b.Fatalf("%s: %v", name, err)
	}
	b.Cleanup(d.close)
	s := &sliceRunner{name: name}
	for w := range cfg.workers() {
		s.callers = append(s.callers, d.caller(w))
	}
	b.Cleanup(func() {
		for _, c := range s.callers {
			c.close()
		}
	})
	return s
}

// run calls for d with every caller, each one call in flight.
func (s *sliceRunner) run(b *testing.B, d time.Duration) {
	var n atomic.Int64
	var wg sync.WaitGroup
	cpu0 := selfCPU(b)
	start := time.Now()
	deadline := start.Add(d)
	for _, c := range s.callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := tally{}
			var calls int64
			for time.Now().Before(deadline) {
				c.call(context.Background(), 1, t)
				calls++
			}
			n.Add(calls)
			for k, v := range t {
				if k.kind == kindError {
					b.Errorf("%s: %d calls failed: %s", s.name, v, k.reason)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := selfCPU(b) - cpu0
	calls := n.Load()
	if calls == 0 {
		b.Fatalf("%s: no call answered in %v", s.name, d)
	}
	s.cpu = append(s.cpu, float64(cpu)/float64(time.Microsecond)/float64(calls))
	s.rate = append(s.rate, float64(calls)/elapsed.Seconds())
}

func (s *sliceRunner) last() float64 { return s.cpu[len(s.cpu)-1] }

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// selfCPU is the user and system CPU time this process has used.
func selfCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
