package harness

import (
	"net"
	"sync"
	"testing"
)

// StallProxy forwards TCP connections to an upstream address, and can
// stall them: while stalled, bytes already read in either direction wait
// and nothing is written, but no connection is closed. A peer behind it
// then sees what a hung or partitioned server gives: calls that neither
// answer nor fail until their own deadline. New connections are accepted
// and dialled as usual (and stall too).
type StallProxy struct {
	ln       net.Listener
	upstream string

	mu      sync.Mutex
	stalled bool
	resume  chan struct{} // closed when a stall ends
	conns   map[net.Conn]struct{}
	closed  bool
	wg      sync.WaitGroup
}

// NewStallProxy listens on a loopback port of its own and forwards to
// upstream until the test ends.
func NewStallProxy(t testing.TB, upstream string) *StallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("harness: stall proxy listen: %v", err)
	}
	p := &StallProxy{ln: ln, upstream: upstream, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's address, for the peer to dial instead of upstream.
func (p *StallProxy) Addr() string { return p.ln.Addr().String() }

// Stall holds every byte from now on, in both directions, until Resume.
func (p *StallProxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stalled {
		p.stalled, p.resume = true, make(chan struct{})
	}
}

// Resume lets the held bytes go on.
func (p *StallProxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled {
		p.stalled = false
		close(p.resume)
	}
}

// gate returns once the proxy is not stalled (or is closing).
func (p *StallProxy) gate() bool {
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return false
		}
		if !p.stalled {
			p.mu.Unlock()
			return true
		}
		ch := p.resume
		p.mu.Unlock()
		<-ch
	}
}

func (p *StallProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = c.Close()
			continue
		}
		if !p.track(c, up) {
			return
		}
		p.wg.Add(2)
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

func (p *StallProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range cs {
			_ = c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *StallProxy) pipe(src, dst net.Conn) {
	defer p.wg.Done()
	defer src.Close()
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.gate() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or a closed connection: both halves close
		}
	}
}

func (p *StallProxy) close() {
	p.mu.Lock()
	p.closed = true
	if p.stalled {
		p.stalled = false
		close(p.resume)
	}
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	p.wg.Wait()
}
