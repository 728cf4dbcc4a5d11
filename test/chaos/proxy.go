package chaos

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// Direction names the half of a connection a fault applies to.
type Direction string

const (
	Upstream   Direction = "upstream"   // client to server: requests
	Downstream Direction = "downstream" // server to client: replies
)

// Proxy is an in-process TCP fault proxy on loopback in front of one
// upstream address (Shopify's toxiproxy, embedded: no toxiproxy-server
// process, no HTTP API). Faults stack; Heal removes them all.
type Proxy struct {
	t    testing.TB
	mu   sync.Mutex
	p    *toxiproxy.Proxy
	name string
	n    int
}

// NewProxy listens on a free loopback port and forwards to upstream. It is
// stopped in t.Cleanup.
func NewProxy(t testing.TB, name, upstream string) *Proxy {
	t.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("chaos: proxy %s -> %s: %v", name, upstream, err)
	}
	px := &Proxy{t: t, p: p, name: name}
	t.Cleanup(func() { px.p.Stop() })
	return px
}

// Addr is where clients connect.
func (p *Proxy) Addr() string { return p.p.Listen }

func (p *Proxy) add(typ string, dir Direction, attrs string) {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++
	body := fmt.Sprintf(`{"name":"%s-%d","type":%q,"stream":%q,"attributes":%s}`, typ, p.n, typ, string(dir), attrs)
	if _, err := p.p.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
		p.t.Fatalf("chaos: proxy %s: add %s: %v", p.name, body, err)
	}
}

// Blackhole drops every byte in the given directions (none given: both)
// on existing and new connections; connections stay open, so peers wait
// for their own timeouts, as behind a silent network partition.
func (p *Proxy) Blackhole(dirs ...Direction) {
	if len(dirs) == 0 {
		dirs = []Direction{Upstream, Downstream}
	}
	for _, d := range dirs {
		p.add("timeout", d, `{"timeout":0}`)
	}
}

// Delay adds latency (plus up to jitter) to every chunk in one direction.
func (p *Proxy) Delay(dir Direction, latency, jitter time.Duration) {
	p.add("latency", dir, fmt.Sprintf(`{"latency":%d,"jitter":%d}`, latency.Milliseconds(), jitter.Milliseconds()))
}

// Heal removes every fault. Connections that were blackholed are closed
// as the blackhole lifts (toxiproxy's timeout toxic does so), which is
// what their clients, having timed out, would do anyway.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.p.Toxics.ResetToxics(context.Background())
}

// Cut closes every existing connection (peers see a reset or EOF) and
// keeps accepting new ones on the same address.
func (p *Proxy) Cut() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.p.Stop()
	if err := p.p.Start(); err != nil {
		p.t.Fatalf("chaos: proxy %s: restart after cut: %v", p.name, err)
	}
}

// Retarget points the proxy at another upstream, on the same address:
// every existing connection is closed (as by Cut) and new ones reach the
// new upstream, as a virtual IP moved to a promoted replica would.
func (p *Proxy) Retarget(upstream string) {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.p.Stop()
	p.p.Lock()
	p.p.Upstream = upstream
	p.p.Unlock()
	if err := p.p.Start(); err != nil {
		p.t.Fatalf("chaos: proxy %s: restart towards %s: %v", p.name, upstream, err)
	}
}
