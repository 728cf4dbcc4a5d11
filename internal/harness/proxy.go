package harness

import (
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Direction names the half of a proxied connection a fault applies to.
type Direction int

const (
	Upstream   Direction = iota // client to server: requests
	Downstream                  // server to client: replies
)

func (d Direction) String() string {
	if d == Upstream {
		return "upstream"
	}
	return "downstream"
}

// Proxy is a TCP proxy on a loopback port of its own in front of one
// upstream address, with every fault the tests put on a link: Stall (hold
// every byte, close nothing), Blackhole (drop bytes, close nothing), Delay
// (latency per chunk), SetRate (a byte rate per connection), Reset (close
// the connections with a reset) and Retarget (move to another upstream, as
// a virtual IP moved to a promoted replica). Faults apply to existing and
// new connections alike, and bytes keep their order.
type Proxy struct {
	ln   net.Listener
	done chan struct{} // closed when the proxy closes

	mu        sync.Mutex
	upstream  string
	stalled   bool
	resume    chan struct{} // closed when a stall ends
	blackhole [2]bool
	latency   [2]time.Duration
	jitter    [2]time.Duration
	rate      [2]float64 // bytes per second; 0: full speed
	rnd       *rand.Rand
	links     map[*link]struct{}
	closed    bool
	wg        sync.WaitGroup
}

// link is one proxied connection: the client's side and the upstream's.
type link struct {
	client, server net.Conn
	dropped        atomic.Bool // a blackhole dropped some of its bytes
	halves         atomic.Int32
}

// NewProxy listens on a loopback port of its own and forwards to upstream
// until the test ends.
func NewProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("harness: proxy to %s: listen: %v", upstream, err)
	}
	p := &Proxy{ln: ln, done: make(chan struct{}), upstream: upstream,
		rnd: rand.New(rand.NewPCG(rand.Uint64(), 0)), links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's address, for the peer to dial instead of upstream.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Stall holds every byte from now on, in both directions, until Resume or
// Heal: bytes already read wait and nothing is written, but no connection
// is closed, so a peer sees what a hung or partitioned server gives: calls
// that neither answer nor fail until their own deadline.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stalled {
		p.stalled, p.resume = true, make(chan struct{})
	}
}

// Resume lets the held bytes go on.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.resumeLocked()
}

func (p *Proxy) resumeLocked() {
	if p.stalled {
		p.stalled = false
		close(p.resume)
	}
}

// Blackhole drops every byte in the given directions (none given: both)
// on existing and new connections until Heal; connections stay open, so
// peers wait for their own timeouts, as behind a silent partition.
func (p *Proxy) Blackhole(dirs ...Direction) {
	if len(dirs) == 0 {
		dirs = []Direction{Upstream, Downstream}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, d := range dirs {
		p.blackhole[d] = true
	}
}

// Delay holds every chunk in one direction for latency, plus or minus up
// to jitter, until Heal.
func (p *Proxy) Delay(dir Direction, latency, jitter time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency[dir], p.jitter[dir] = latency, jitter
}

// SetRate passes at most bytesPerSecond in one direction of each
// connection (0: full speed), from its next read on: a link over which a
// request's time grows with its size, as on a slow network. Each
// connection has its own budget, so a large request on one does not delay
// another's.
func (p *Proxy) SetRate(dir Direction, bytesPerSecond float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rate[dir] = bytesPerSecond
}

// Heal removes every fault. The connections a blackhole dropped bytes of
// are closed (their streams lost bytes in the middle, which no protocol
// recovers from; their clients, having timed out, would close them anyway).
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.resumeLocked()
	p.blackhole = [2]bool{}
	p.latency, p.jitter, p.rate = [2]time.Duration{}, [2]time.Duration{}, [2]float64{}
	var lost []*link
	for l := range p.links {
		if l.dropped.Load() {
			lost = append(lost, l)
		}
	}
	p.mu.Unlock()
	for _, l := range lost {
		l.close(false)
	}
}

// Reset closes every existing connection, the client's side with a TCP
// reset, and keeps accepting new ones on the same address.
func (p *Proxy) Reset() {
	for _, l := range p.snapshot() {
		l.close(true)
	}
}

// Retarget points the proxy at another upstream, on the same address:
// every existing connection is closed (as by Reset) and new ones reach the
// new upstream.
func (p *Proxy) Retarget(upstream string) {
	p.mu.Lock()
	p.upstream = upstream
	p.mu.Unlock()
	p.Reset()
}

func (p *Proxy) snapshot() []*link {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*link, 0, len(p.links))
	for l := range p.links {
		out = append(out, l)
	}
	return out
}

func (l *link) close(reset bool) {
	if tc, ok := l.client.(*net.TCPConn); ok && reset {
		_ = tc.SetLinger(0)
	}
	_ = l.client.Close()
	_ = l.server.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		upstream := p.upstream
		p.mu.Unlock()
		up, err := net.Dial("tcp", upstream)
		if err != nil {
			_ = c.Close()
			continue
		}
		l := &link{client: c, server: up}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			l.close(false)
			return
		}
		p.links[l] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(l, Upstream, c, up)
		go p.pipe(l, Downstream, up, c)
	}
}

// chunk is what one read returned, due for writing at due.
type chunk struct {
	b   []byte
	due time.Time
}

// pipe copies src to dst through the faults of dir: a reader drops what a
// blackhole takes and stamps the rest with its delay; a writer waits for
// each chunk's time, a stall's end and the rate's budget. When src ends,
// dst is half-closed once the chunks before the end are written; when both
// directions have ended, the link is closed and forgotten.
func (p *Proxy) pipe(l *link, dir Direction, src, dst net.Conn) {
	defer p.wg.Done()
	chunks := make(chan chunk, 64)
	go func() {
		defer close(chunks)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				if due, keep := p.stamp(dir); keep {
					select {
					case chunks <- chunk{b: buf[:n], due: due}:
					case <-p.done:
						return
					}
				} else {
					l.dropped.Store(true)
				}
			}
			if err != nil {
				return
			}
		}
	}()
	ok := p.write(dir, dst, chunks)
	if ok {
		if tc, isTCP := dst.(*net.TCPConn); isTCP {
			_ = tc.CloseWrite()
		}
	} else {
		l.close(false)
	}
	for range chunks {
		// the reader ends once src is closed
	}
	if l.halves.Add(1) == 2 {
		l.close(false)
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
	}
}

// stamp says when a chunk read now in dir is due, and whether it is kept.
func (p *Proxy) stamp(dir Direction) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.blackhole[dir] {
		return time.Time{}, false
	}
	d := p.latency[dir]
	if j := p.jitter[dir]; j > 0 {
		d += time.Duration(p.rnd.Int64N(2*int64(j)+1)) - j
	}
	return time.Now().Add(d), true
}

// write writes the chunks to dst in order; false when dst failed or the
// proxy closed.
func (p *Proxy) write(dir Direction, dst io.Writer, chunks <-chan chunk) bool {
	next := time.Now() // the rate's budget: when the next byte may go
	for c := range chunks {
		if !p.sleepUntil(c.due) || !p.gate() {
			return false
		}
		p.mu.Lock()
		rate := p.rate[dir]
		p.mu.Unlock()
		if rate > 0 {
			if now := time.Now(); next.Before(now) {
				next = now // an idle connection saves no budget
			}
			next = next.Add(time.Duration(float64(len(c.b)) / rate * float64(time.Second)))
			if !p.sleepUntil(next) {
				return false
			}
		}
		if _, err := dst.Write(c.b); err != nil {
			return false
		}
	}
	return true
}

func (p *Proxy) sleepUntil(at time.Time) bool {
	d := time.Until(at)
	if d <= 0 {
		return true
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-p.done:
		return false
	}
}

// gate returns once the proxy is not stalled; false if it closes.
func (p *Proxy) gate() bool {
	for {
		p.mu.Lock()
		if !p.stalled {
			p.mu.Unlock()
			return true
		}
		ch := p.resume
		p.mu.Unlock()
		select {
		case <-ch:
		case <-p.done:
			return false
		}
	}
}

func (p *Proxy) close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	close(p.done)
	p.mu.Unlock()
	_ = p.ln.Close()
	for _, l := range p.snapshot() {
		l.close(false)
	}
	p.wg.Wait()
}
