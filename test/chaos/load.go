package chaos

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/sys/unix"

	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// mono is CLOCK_MONOTONIC in nanoseconds, the clock of the agents'
// admission logs, so the test's fault times line up with them.
func mono() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return time.Duration(ts.Nano())
}

// Target is open-loop load on one (rule, subject) through one agent.
type Target struct {
	Agent   *Agent
	Rule    string
	Subject string
	Rate    float64 // requests per second offered
	// RequestIDs gives every request a unique request_id.
	RequestIDs bool
	// Envoy sends the request through Envoy's rate-limit service
	// (ShouldRateLimit) instead of Allow: one descriptor with these
	// entries (key, value, key, value...) in domain EnvoyDomain. Rule and
	// Subject then only label the calls.
	Envoy       []string
	EnvoyDomain string
	// Check sends the request to the agent's HTTP check endpoint instead
	// (GET /v1/check with these descriptors as the query), as a gateway
	// delegating its check does: 200 is an admission, 429 a denial, any
	// other answer (503 for a fail_closed rule without budget) an error.
	Check url.Values
}

// errStopped marks a call cut off when the load stopped: its answer is
// lost, the agent may have charged it.
var errStopped = errors.New("chaos: call cut off when the load stopped")

// Call is one answered (or failed) call, timed on the client. A call cut
// off when the load stopped has Err errStopped: the agent may have
// charged it, and the cross-check must know of it.
type Call struct {
	Target     int
	Start, End time.Duration // mono()
	Allowed    bool
	Reason     rationv1.Reason
	Err        error
	RequestID  string
	AgentID    string
	Rule, Subj string
}

// Load runs targets until Stop, or until its time is up (StartLoadFor).
// Requests are dispatched every 5ms to keep
// each target's offered rate; a target whose workers are all busy (its
// agent paused) drops what it cannot send, and counts it.
type Load struct {
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	mu      sync.Mutex
	calls   []Call
	dropped atomic.Int64
	http    *http.Client // for Check targets
}

const loadWorkers = 6

// maxScenarioLoad bounds the load of a scenario (StartLoad), which stops
// it well before this.
const maxScenarioLoad = 2 * time.Minute

// StartLoad begins offering load, for at most maxScenarioLoad.
func StartLoad(targets []Target) *Load { return StartLoadFor(targets, maxScenarioLoad) }

// StartLoadFor begins offering load for at most d: the load ends by itself
// then (calls in flight are cut off, as by Stop), so it is bounded in time
// and in count (each target's rate x d) whatever its caller does.
func StartLoadFor(targets []Target, d time.Duration) *Load {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	l := &Load{cancel: cancel, http: &http.Client{Timeout: 2 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: loadWorkers * len(targets)}}}
	for ti, tg := range targets {
		jobs := make(chan int64, 256)
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer close(jobs)
			start := time.Now()
			var sent int64
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				due := int64(tg.Rate * time.Since(start).Seconds())
				for ; sent < due; sent++ {
					select {
					case jobs <- sent:
					default:
						l.dropped.Add(1)
					}
				}
			}
		}()
		for range loadWorkers {
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				for n := range jobs {
					l.call(ctx, ti, tg, n)
				}
			}()
		}
	}
	return l
}

func (l *Load) call(ctx context.Context, ti int, tg Target, n int64) {
	if tg.Envoy != nil {
		l.callEnvoy(ctx, ti, tg)
		return
	}
	if tg.Check != nil {
		l.callCheck(ctx, ti, tg)
		return
	}
	req := &rationv1.AllowRequest{Rule: tg.Rule, Subject: tg.Subject}
	if tg.RequestIDs {
		req.RequestId = fmt.Sprintf("%s-%s-%d", tg.Agent.ID, tg.Subject, n)
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c := Call{Target: ti, Start: mono(), RequestID: req.RequestId, AgentID: tg.Agent.ID, Rule: tg.Rule, Subj: tg.Subject}
	resp, err := tg.Agent.Client.Allow(cctx, req)
	c.End = mono()
	if ctx.Err() != nil {
		err = errStopped // stopping: not an answer, but maybe a charge
	}
	if err != nil {
		c.Err = err
	} else {
		c.Allowed, c.Reason = resp.Allowed, resp.Reason
	}
	l.mu.Lock()
	l.calls = append(l.calls, c)
	l.mu.Unlock()
}

// callEnvoy makes one ShouldRateLimit call, as Envoy's rate-limit filter
// does. OK is an admission, OVER_LIMIT a denial (REASON_OVER_LIMIT); an
// error (UNAVAILABLE for a fail_closed rule) is recorded as such.
func (l *Load) callEnvoy(ctx context.Context, ti int, tg Target) {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(tg.Envoy); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: tg.Envoy[i], Value: tg.Envoy[i+1]})
	}
	req := &rlsv3.RateLimitRequest{Domain: tg.EnvoyDomain, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c := Call{Target: ti, Start: mono(), AgentID: tg.Agent.ID, Rule: tg.Rule, Subj: tg.Subject}
	resp, err := tg.Agent.RLS.ShouldRateLimit(cctx, req)
	c.End = mono()
	if ctx.Err() != nil {
		err = errStopped // stopping: not an answer, but maybe a charge
	}
	switch {
	case err != nil:
		c.Err = err
	case resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
		c.Allowed, c.Reason = true, rationv1.Reason_REASON_OK
	default:
		c.Reason = rationv1.Reason_REASON_OVER_LIMIT
	}
	l.mu.Lock()
	l.calls = append(l.calls, c)
	l.mu.Unlock()
}

// callCheck makes one GET /v1/check call. The call ends when the answer's
// status arrives, which is when a gateway would let the request through.
func (l *Load) callCheck(ctx context.Context, ti int, tg Target) {
	c := Call{Target: ti, Start: mono(), AgentID: tg.Agent.ID, Rule: tg.Rule, Subj: tg.Subject}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+tg.Agent.HTTP+"/v1/check?"+tg.Check.Encode(), nil)
	if err != nil {
		panic(err) // a malformed target
	}
	resp, err := l.http.Do(req)
	c.End = mono()
	if ctx.Err() != nil {
		if err == nil {
			resp.Body.Close()
		}
		err = errStopped // stopping: not an answer, but maybe a charge
	}
	if err == nil {
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			c.Allowed, c.Reason = true, rationv1.Reason_REASON_OK
		case http.StatusTooManyRequests:
			c.Reason = rationv1.Reason_REASON_OVER_LIMIT
		default:
			err = fmt.Errorf("GET /v1/check: %s", resp.Status)
		}
	}
	c.Err = err
	l.mu.Lock()
	l.calls = append(l.calls, c)
	l.mu.Unlock()
}

// Stop ends the load and returns every call made (those cut off by the
// stop with Err errStopped).
func (l *Load) Stop() []Call {
	l.cancel()
	l.wg.Wait()
	l.http.CloseIdleConnections()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.calls
}

// Calls returns the calls answered so far (or cut off), in the order they
// ended. The slice is shared, not copied: calls are only ever appended,
// so what it holds does not change.
func (l *Load) Calls() []Call {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.calls[:len(l.calls):len(l.calls)]
}

// Dropped is how many requests could not be sent (all workers busy).
func (l *Load) Dropped() int64 { return l.dropped.Load() }
