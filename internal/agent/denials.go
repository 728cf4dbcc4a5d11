package agent

import (
	"context"
	"hash/maphash"
	"math"
	"sync/atomic"
	"time"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/rules"
)

// A subject over its limit keeps asking: a client in a retry loop, a
// flood. Each of those requests cost a script call on a mode: redis rule
// although the store has just answered "denied" and the answer cannot have
// changed yet. The agent remembers the store's last answer for each bucket
// that left it short of the request's cost (a denial, or the admission that
// took its last whole tokens; a bounded table) and denies the bucket's
// further requests itself while their denial is certain.
//
// Certain: the store answered at some moment after the call was sent
// (sent) that the bucket held tokens t (Remaining). From then on, the
// bucket can hold at most t + r·(now - sent), capped at its burst: it
// refills at r and nothing else adds to it but a refund. A request of cost
// c > that ceiling is denied by the store, whatever else happened; one of
// c <= the ceiling goes to the store. So a local denial never outlives
// the refill: the first request that the refill could admit is sent. The
// ceiling is computed from the send, not the answer (the store's moment
// lies between), and with slack added, so it errs towards asking.
//
// What it can cost: a refund by another agent (its multi-rule request
// denied by another rule, its admitted tokens given back) adds tokens
// this agent does not see. Until the local denial lapses ((c - t)/r
// after the send at most), requests that those tokens would have paid for
// are denied here; nothing is ever admitted that the store would deny. The
// agent's own refunds forget the bucket's denial. A Redis failover that
// loses the bucket (it comes back full) is seen at the same lapse.
//
// Not remembered: shadow rules (their denials are counted, not enforced,
// and must reach the store to be counted there too), mode auto rules (the
// store counts their traffic to promote a hot subject), requests with a
// request id (a retry must get the recorded answer), rate 0 buckets
// (nothing refills: the denial would never lapse by itself).
type denials struct {
	slots []atomic.Pointer[denial]
	mask  uint64
	seed  maphash.Seed
}

// denial is the store's denial of one bucket.
type denial struct {
	key    string
	limit  bucket.Limit
	tokens float64 // what the store said the bucket held after it
	sent   int64   // sinceStart when the call that got it was sent
	// Once the denial lapses, one request asks the store again (the
	// probe); the others that arrive meanwhile wait for its answer, which
	// may be a new denial, rather than each asking the store: in a flood
	// from many callers, the lapse otherwise sent every request that
	// arrived within a round trip to Redis. done is closed when the
	// probe's answer is in.
	probing atomic.Bool
	done    chan struct{}
}

// denialSlack is added to the time since the send, with a 1/2000th of
// it: the store's clock counts whole microseconds, and it may run faster
// than the agent's (NTP slews a clock by up to 500 ppm). A slack of a whole
// millisecond left a bucket one token short denied locally for ever less
// of each refill interval, and a flood sent five calls per interval.
const denialSlack = 100 * time.Microsecond

// slackened is elapsed as the store's clock may have counted it, at most.
func slackened(elapsed time.Duration) time.Duration {
	return elapsed + elapsed/2000 + denialSlack
}

// DefaultLocalDenials is how many buckets' denials an agent remembers
// (-local-denials): 8192 entries of about 100 bytes and their keys.
const DefaultLocalDenials = 8192

// MaxLocalDenials bounds -local-denials.
const MaxLocalDenials = 1 << 20

// newDenials remembers up to n denials (rounded up to a power of two);
// nil (every decision goes to the store) for n <= 0.
func newDenials(n int) *denials {
	if n <= 0 {
		return nil
	}
	size := 1
	for size < n {
		size <<= 1
	}
	return &denials{slots: make([]atomic.Pointer[denial], size), mask: uint64(size - 1), seed: maphash.MakeSeed()}
}

// start anchors sinceStart.
var start = time.Now()

// sinceStart is the monotonic clock in nanoseconds since the process
// started: Go's own reading (no system call, unlike monoNow's
// CLOCK_MONOTONIC, which the admission log needs to compare processes).
func sinceStart() int64 { return int64(time.Since(start)) }

// cacheable says whether st's denial may be remembered and answered
// locally.
func cacheable(st *step) bool {
	return st.rule.Mode == rules.ModeRedis && !st.rule.Shadow && st.req.Hot == nil &&
		st.req.RequestID == "" && st.req.Limit.Rate > 0
}

func (d *denials) slot(key string) *atomic.Pointer[denial] {
	return &d.slots[maphash.String(d.seed, key)&d.mask]
}

// record remembers the store's answer res to st's request, sent at sent,
// when it leaves the bucket short of that request's cost: a denial, or an
// admission that took the last whole tokens (after which, in a flood, the
// next requests would all have gone to the store to be denied).
func (d *denials) record(st *step, res bucket.Result, sent int64) {
	if d == nil || res.Replayed || res.Remaining >= st.req.Cost || !cacheable(st) {
		return
	}
	d.slot(st.req.Key).Store(&denial{key: st.req.Key, limit: st.req.Limit, tokens: res.Remaining, sent: sent, done: make(chan struct{})})
}

// forget drops what is remembered of key: this agent gave tokens back.
func (d *denials) forget(key string) {
	if d == nil {
		return
	}
	p := d.slot(key)
	if e := p.Load(); e != nil && e.key == key {
		p.CompareAndSwap(e, nil)
	}
}

// lookup is what is remembered of st's bucket under st's limit, or nil.
func (d *denials) lookup(st *step) *denial {
	if d == nil || !cacheable(st) {
		return nil
	}
	e := d.slot(st.req.Key).Load()
	if e == nil || e.key != st.req.Key || e.limit != st.req.Limit {
		return nil
	}
	return e
}

// denyLocally decides st without the store when the remembered answer
// makes its denial certain, and says so. When that answer has lapsed, st
// either becomes the one request that asks the store again (st.probe, to
// be released by probed once answered) or waits for that request's answer
// (at most its decision timeout: the store call is bounded) and looks
// again; ctx is st's caller's. A batch that holds a probe of its own
// (an earlier step claimed one) never waits: it answers that probe only
// after its last step, so waiting could close a cycle (batch A holds x's
// probe and waits on y's, B holds y's and waits on x's) that only the
// callers' deadlines would break, and a call without one never.
func (d *denials) denyLocally(ctx context.Context, st *step, steps []step) bool {
	for waited := false; ; waited = true {
		e := d.lookup(st)
		if e == nil {
			return false
		}
		if res, ok := deniedUntilRefill(e.tokens, e.limit, st.req.Cost, time.Duration(sinceStart()-e.sent)); ok {
			st.path, st.res, st.allowed, st.reason = pathCached, res, false, ReasonOverLimit
			return true
		}
		if e.probing.CompareAndSwap(false, true) {
			st.probe = e
			return false
		}
		if waited || holdsProbe(steps) {
			return false
		}
		select {
		case <-e.done:
		case <-ctx.Done():
			return false
		}
	}
}

// holdsProbe says whether one of steps claimed a probe, to be released
// once the batch is answered (probed).
func holdsProbe(steps []step) bool {
	for i := range steps {
		if steps[i].probe != nil {
			return true
		}
	}
	return false
}

// probed releases the probes steps claimed: their answers are in (or they
// never went to the store), and the requests waiting for them look again.
func probed(steps []step) {
	for i := range steps {
		if e := steps[i].probe; e != nil {
			steps[i].probe = nil
			close(e.done)
		}
	}
}

// deniedUntilRefill is the store's answer to a request of cost on a bucket
// of limit that held tokens elapsed ago, when it is certainly a denial: the
// most the bucket can hold now (tokens refilled over elapsed, slackened,
// capped at the burst) is less than cost. The answer's remaining, retry and reset
// are that ceiling's, so its Retry-After is never longer than the
// store's.
func deniedUntilRefill(tokens float64, limit bucket.Limit, cost float64, elapsed time.Duration) (bucket.Result, bool) {
	if elapsed < 0 || limit.Rate <= 0 {
		return bucket.Result{}, false
	}
	ceiling := math.Min(limit.Burst, tokens+limit.Rate*slackened(elapsed).Seconds())
	if !(cost > ceiling) {
		return bucket.Result{}, false
	}
	return bucket.Result{
		Remaining:  ceiling,
		RetryAfter: seconds((cost - ceiling) / limit.Rate),
		Reset:      seconds((limit.Burst - ceiling) / limit.Rate),
	}, true
}

// seconds is s as a Duration, rounded down.
func seconds(s float64) time.Duration {
	if s >= float64(math.MaxInt64)/1e9 {
		return math.MaxInt64
	}
	return time.Duration(s * 1e9)
}
