package agent_test

import (
	"context"
	"fmt"
	"maps"
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

// rlqsClient behaves as Envoy's rate_limit_quota filter documents, with
// the settings Ration expects (docs/integrations/envoy-rlqs.md): a bucket's
// first request sends a report at once (the subscription); every interval
// all buckets are reported; until its first assignment, and once one
// expires, a bucket denies (no_assignment_behavior DENY_ALL, no
// expired_assignment_behavior); a token bucket assignment starts full
// unless it repeats the active one's sizes (then the bucket carries on), its
// TTL in whole seconds; abandon forgets the bucket.
type rlqsClient struct {
	domain   string
	interval time.Duration
	admit    func() // called for each admission (under mu)
	stream   rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient

	mu      sync.Mutex
	buckets map[string]*clientBucket
	sendMu  sync.Mutex
	err     error
}

type clientBucket struct {
	id              map[string]string
	allowed, denied uint64
	kind            string // "", token_bucket, allow_all, deny_all
	max, rate       float64
	level           float64
	updated         time.Time
	expires         time.Time
}

func dialRLQS(t *testing.T, addr, domain string, interval time.Duration, admit func()) *rlqsClient {
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
	c := &rlqsClient{domain: domain, interval: interval, admit: admit, stream: stream, buckets: map[string]*clientBucket{}}
	go c.receive()
	go c.reportLoop(ctx)
	return c
}

func bucketName(id map[string]string) string {
	keys := slices.Sorted(maps.Keys(id))
	var sb strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&sb, "%q=%q,", k, id[k])
	}
	return sb.String()
}

// request decides one request of bucket id and reports whether it passed.
func (c *rlqsClient) request(id map[string]string) bool {
	c.mu.Lock()
	key := bucketName(id)
	b := c.buckets[key]
	first := b == nil
	if first {
		b = &clientBucket{id: id}
		c.buckets[key] = b
	}
	now := time.Now()
	ok := false
	if b.kind != "" && now.Before(b.expires) {
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
	}
	if ok {
		b.allowed++
		c.admit()
	} else {
		b.denied++
	}
	var rep *rlqsv3.RateLimitQuotaUsageReports
	if first {
		rep = c.reportLocked([]*clientBucket{b})
	}
	c.mu.Unlock()
	if rep != nil {
		c.send(rep)
	}
	return ok
}

// reportLocked builds a report of bs, resetting their counts; c.mu held.
func (c *rlqsClient) reportLocked(bs []*clientBucket) *rlqsv3.RateLimitQuotaUsageReports {
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

func (c *rlqsClient) send(rep *rlqsv3.RateLimitQuotaUsageReports) {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	if err := c.stream.Send(rep); err != nil && c.err == nil {
		c.err = err
	}
}

func (c *rlqsClient) reportLoop(ctx context.Context) {
	t := time.NewTicker(c.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.mu.Lock()
		bs := make([]*clientBucket, 0, len(c.buckets))
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
func (c *rlqsClient) receive() {
	for {
		resp, err := c.stream.Recv()
		if err != nil {
			c.mu.Lock()
			if c.err == nil {
				c.err = err
			}
			c.mu.Unlock()
			return
		}
		now := time.Now()
		c.mu.Lock()
		for _, a := range resp.GetBucketAction() {
			key := bucketName(a.GetBucketId().GetBucket())
			b := c.buckets[key]
			if b == nil {
				continue // Envoy ignores actions for buckets it does not hold
			}
			if a.GetAbandonAction() != nil {
				delete(c.buckets, key)
				continue
			}
			qa := a.GetQuotaAssignmentAction()
			s := qa.GetRateLimitStrategy()
			// Envoy reads the TTL's whole seconds only.
			b.expires = now.Add(time.Duration(qa.GetAssignmentTimeToLive().GetSeconds()) * time.Second)
			if tb := s.GetTokenBucket(); tb != nil {
				m, r := float64(tb.GetMaxTokens()), float64(tb.GetTokensPerFill().GetValue())/float64(tb.GetFillInterval().GetSeconds())
				if b.kind != "token_bucket" || b.max != m || b.rate != r {
					b.level = m // a new bucket starts full
				} else {
					b.level = min(m, b.level+r*now.Sub(b.updated).Seconds()) // carried on
				}
				b.kind, b.max, b.rate, b.updated = "token_bucket", m, r, now
				continue
			}
			if s.GetBlanketRule().String() == "DENY_ALL" {
				b.kind = "deny_all"
			} else {
				b.kind = "allow_all"
			}
		}
		c.mu.Unlock()
	}
}

func (c *rlqsClient) failed() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}
