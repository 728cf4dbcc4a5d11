package harness

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
)

// RLQSClient behaves as Envoy's rate_limit_quota filter documents, with
// the settings Ration expects (docs/integrations/envoy-rlqs.md): a bucket's
// first request sends a report at once (the subscription); every interval
// all buckets are reported; an assignment applies from its receipt until
// the next action for its bucket or its TTL (whole seconds), whichever is
// first, whether or not reports are answered; until its first assignment,
// and once one expires, a bucket denies (no_assignment_behavior DENY_ALL,
// no expired_assignment_behavior: Envoy drops the expired assignment and
// its token bucket, and keeps reporting the bucket); a token bucket
// assignment carries the bucket in force on when it repeats its sizes
// (max_tokens, tokens_per_fill, fill_interval's nanos), and otherwise
// starts a new one at the fill ratio of the one in force, or full when
// none is (none yet, an expired one, a blanket rule); abandon forgets the
// bucket.
//
// Every decision is the client's own, as Envoy's are: the agent only sees
// reports. Agent tests, test/chaos and the RLQS load program share it.
type RLQSClient struct {
	domain   string
	interval time.Duration
	admit    func() // called for each admission, under mu
	deny     func() // called for each refusal, under mu (nil: none)
	stream   rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient

	mu              sync.Mutex
	buckets         map[string]*rlqsBucket
	allowed, denied uint64 // every decision since the start
	reports         uint64 // bucket usages reported since the start
	err             error
	sendMu          sync.Mutex
	// restarts: start a new, full bucket on every token bucket
	// assignment, as Envoys before the filter's global client did.
	restarts bool
}

// OnDeny has c call deny for each refusal (under its lock, as admit), so
// that a judge of false refusals sees them: call it before any Request.
func (c *RLQSClient) OnDeny(deny func()) {
	c.mu.Lock()
	c.deny = deny
	c.mu.Unlock()
}

// RestartBuckets makes c start a new, full bucket on every token bucket
// assignment, unchanged ones too: an Envoy older than the filter's global
// client (the agent's -rlqs-no-carry).
func (c *RLQSClient) RestartBuckets() {
	c.mu.Lock()
	c.restarts = true
	c.mu.Unlock()
}

type rlqsBucket struct {
	id              map[string]string
	allowed, denied uint64 // since the last report
	kind            string // "", token_bucket, allow_all, deny_all
	max, rate       float64
	// perFill and nanos are the assignment's tokens_per_fill and its
	// fill_interval's nanos: with max_tokens, what Envoy compares.
	perFill uint32
	nanos   int32
	level   float64
	updated time.Time
	expires time.Time
}

// DialRLQS opens an RLQS stream to addr for domain and starts reporting
// every interval; admit, if not nil, is called for each admission the
// client makes (under its lock: keep it short). The stream and its
// goroutines end with t.
func DialRLQS(t testing.TB, addr, domain string, interval time.Duration, admit func()) *RLQSClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if admit == nil {
		admit = func() {}
	}
	c := &RLQSClient{domain: domain, interval: interval, admit: admit, stream: stream, buckets: map[string]*rlqsBucket{}}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); c.receive() }()
	go func() { defer wg.Done(); c.reportLoop(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return c
}

func rlqsBucketName(id map[string]string) string {
	var sb strings.Builder
	for _, k := range slices.Sorted(maps.Keys(id)) {
		fmt.Fprintf(&sb, "%q=%q,", k, id[k])
	}
	return sb.String()
}

// Request decides one request of bucket id, as the filter would, and
// reports whether it passed.
func (c *RLQSClient) Request(id map[string]string) bool {
	c.mu.Lock()
	key := rlqsBucketName(id)
	b := c.buckets[key]
	first := b == nil
	if first {
		b = &rlqsBucket{id: id}
		c.buckets[key] = b
	}
	now := time.Now()
	b.expire(now)
	ok := false
	switch b.kind {
	case "allow_all":
		ok = true
	case "token_bucket":
		b.level = min(b.max, b.level+b.rate*now.Sub(b.updated).Seconds())
		b.updated = now
		if b.level >= 1 {
			b.level--
			ok = true
		}
	}
	if ok {
		b.allowed++
		c.allowed++
		c.admit()
	} else {
		b.denied++
		c.denied++
		if c.deny != nil {
			c.deny()
		}
	}
	var rep *rlqsv3.RateLimitQuotaUsageReports
	if first {
		rep = c.reportLocked([]*rlqsBucket{b})
	}
	c.mu.Unlock()
	if rep != nil {
		c.send(rep)
	}
	return ok
}

// Decisions is how many requests the client allowed and denied so far.
func (c *RLQSClient) Decisions() (allowed, denied uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.allowed, c.denied
}

// Kind is the kind of bucket id's assignment in force ("" for none, or
// token_bucket, allow_all, deny_all).
func (c *RLQSClient) Kind(id map[string]string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.buckets[rlqsBucketName(id)]
	if b == nil {
		return ""
	}
	b.expire(time.Now())
	return b.kind
}

// Reports is how many bucket usages the client reported so far (a report
// of two buckets counts two).
func (c *RLQSClient) Reports() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reports
}

// reportLocked builds a report of bs, resetting their counts; c.mu held.
func (c *RLQSClient) reportLocked(bs []*rlqsBucket) *rlqsv3.RateLimitQuotaUsageReports {
	c.reports += uint64(len(bs))
	rep := &rlqsv3.RateLimitQuotaUsageReports{Domain: c.domain}
	for _, b := range bs {
		rep.BucketQuotaUsages = append(rep.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           &rlqsv3.BucketId{Bucket: b.id},
			TimeElapsed:        durationpb.New(c.interval),
			NumRequestsAllowed: b.allowed,
			NumRequestsDenied:  b.denied,
		})
		b.allowed, b.denied = 0, 0
	}
	return rep
}

func (c *RLQSClient) send(rep *rlqsv3.RateLimitQuotaUsageReports) {
	c.sendMu.Lock()
	err := c.stream.Send(rep)
	c.sendMu.Unlock()
	if err != nil {
		c.fail(err)
	}
}

func (c *RLQSClient) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
}

func (c *RLQSClient) reportLoop(ctx context.Context) {
	t := time.NewTicker(c.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.mu.Lock()
		bs := make([]*rlqsBucket, 0, len(c.buckets))
		for _, b := range c.buckets {
			bs = append(bs, b)
		}
		var rep *rlqsv3.RateLimitQuotaUsageReports
		if len(bs) > 0 {
			rep = c.reportLocked(bs)
		}
		c.mu.Unlock()
		if rep != nil {
			c.send(rep)
		}
	}
}

// receive applies actions as the filter does.
func (c *RLQSClient) receive() {
	for {
		resp, err := c.stream.Recv()
		if err != nil {
			c.fail(err)
			return
		}
		now := time.Now()
		c.mu.Lock()
		for _, a := range resp.GetBucketAction() {
			c.applyLocked(a, now)
		}
		c.mu.Unlock()
	}
}

// applyLocked applies one bucket action received at now; c.mu held.
func (c *RLQSClient) applyLocked(a *rlqsv3.RateLimitQuotaResponse_BucketAction, now time.Time) {
	key := rlqsBucketName(a.GetBucketId().GetBucket())
	b := c.buckets[key]
	if b == nil {
		return // Envoy ignores actions for buckets it does not hold
	}
	if a.GetAbandonAction() != nil {
		delete(c.buckets, key)
		return
	}
	// An assignment that expired before this one came is gone: a token
	// bucket of the same sizes starts afresh (full), as Envoy's expiry
	// timer drops the cached action and its bucket.
	b.expire(now)
	qa := a.GetQuotaAssignmentAction()
	s := qa.GetRateLimitStrategy()
	// Envoy reads the TTL's whole seconds only.
	b.expires = now.Add(time.Duration(qa.GetAssignmentTimeToLive().GetSeconds()) * time.Second)
	if tb := s.GetTokenBucket(); tb != nil {
		// Envoy refills at tokens_per_fill over the interval's whole
		// seconds, and carries a bucket on when max_tokens,
		// tokens_per_fill and the interval's nanos (not its seconds) are
		// those of the one it holds.
		iv := tb.GetFillInterval()
		secs := (time.Duration(iv.GetSeconds())*time.Second + time.Duration(iv.GetNanos())) / time.Second
		m, f := float64(tb.GetMaxTokens()), tb.GetTokensPerFill().GetValue()
		r := float64(f) / float64(secs)
		held := b.kind == "token_bucket" && !c.restarts
		var level float64
		if held {
			level = min(b.max, b.level+b.rate*now.Sub(b.updated).Seconds())
		}
		switch {
		case !held:
			b.level = m // no bucket in force: the new one starts full
		case b.max != m || b.perFill != f || b.nanos != iv.GetNanos():
			// A new bucket in place of one in force starts at its fill
			// ratio, in whole tokens (createTokenBucketFromAction).
			b.level = math.Floor(m * level / b.max)
		default:
			b.level = level // carried on
		}
		b.kind, b.max, b.rate, b.perFill, b.nanos, b.updated = "token_bucket", m, r, f, iv.GetNanos(), now
		return
	}
	if s.GetBlanketRule().String() == "DENY_ALL" {
		b.kind = "deny_all"
	} else {
		b.kind = "allow_all"
	}
}

// expire forgets b's assignment if it has expired by now: the bucket is
// back to its no_assignment_behavior (DENY_ALL).
func (b *rlqsBucket) expire(now time.Time) {
	if b.kind != "" && !now.Before(b.expires) {
		b.kind = ""
	}
}

// Err is the first error of the stream (nil while it is healthy).
func (c *RLQSClient) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}
