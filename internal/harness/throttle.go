package harness

import (
	"io"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Throttle is a TCP proxy to one address that passes what its clients send
// at most a rate of bytes per second per connection (the answers come back
// at full speed): a link over which a request's time grows with its size,
// as on a slow network, and nothing else is slowed. Each connection has
// its own budget, so a large request on one does not delay another's.
type Throttle struct {
	Addr string // where to connect: 127.0.0.1:port

	ln     net.Listener
	target string
	rate   atomic.Uint64 // math.Float64bits of bytes per second; 0: no limit
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// StartThrottle proxies to target until the test ends, at bytesPerSecond
// (0: at full speed until SetRate).
func StartThrottle(t testing.TB, target string, bytesPerSecond float64) *Throttle {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Throttle{Addr: ln.Addr().String(), ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.SetRate(bytesPerSecond)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// SetRate changes the rate of every connection, from its next read on: a
// test warms a client up at full speed (0), then slows its link.
func (p *Throttle) SetRate(bytesPerSecond float64) {
	p.rate.Store(math.Float64bits(bytesPerSecond))
}

func (p *Throttle) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		if !p.track(c, up) {
			return
		}
		p.wg.Add(2)
		go func() { defer p.wg.Done(); p.paced(up, c); closeWrite(up) }()
		go func() { defer p.wg.Done(); _, _ = io.Copy(c, up); closeWrite(c) }()
	}
}

// track records a connection pair to close with the proxy; false when the
// proxy is closed already (and the pair is closed).
func (p *Throttle) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

// paced copies src to dst, each read's bytes released once the budget of
// the bytes before them has been spent.
func (p *Throttle) paced(dst io.Writer, src io.Reader) {
	buf := make([]byte, 4096)
	next := time.Now()
	for {
		n, err := src.Read(buf)
		if rate := math.Float64frombits(p.rate.Load()); n > 0 && rate > 0 {
			if now := time.Now(); next.Before(now) {
				next = now // an idle connection saves no budget
			}
			next = next.Add(time.Duration(float64(n) / rate * float64(time.Second)))
			time.Sleep(time.Until(next))
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}

func (p *Throttle) close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}
