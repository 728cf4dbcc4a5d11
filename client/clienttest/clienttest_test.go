package clienttest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ration-dev/ration/client"
	"github.com/ration-dev/ration/client/clienttest"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// Bucket: a full bucket per key, refilled at rate by the test's clock, the
// agent's fields and its rounding of waits up to the millisecond.
func TestBucket(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	decide := clienttest.Bucket("per-user", 2, 0.5, clk.now)
	alice := client.Request{Descriptors: map[string]string{"user": "alice"}}
	for i := 0; i < 2; i++ {
		d, err := decide(alice)
		want := client.Decision{Allowed: true, Rule: "per-user", Limit: 2, Rate: 0.5, Remaining: int64(1 - i), Reset: time.Duration(2*(i+1)) * time.Second, Reason: client.ReasonOK}
		if err != nil || d != want {
			t.Fatalf("decision %d = %+v, %v; want %+v", i, d, err, want)
		}
	}
	d, err := decide(alice)
	if err != nil || d.Allowed || d.Reason != client.ReasonOverLimit || d.RetryAfter != 2*time.Second || d.Remaining != 0 || d.Status() != 429 {
		t.Fatalf("3rd = %+v, %v; want over_limit, retry after 2s", d, err)
	}
	// Another key has its own bucket; descriptor order does not matter.
	if d, _ := decide(client.Request{Descriptors: map[string]string{"user": "bob", "x": "1"}}); !d.Allowed {
		t.Fatalf("bob = %+v, want admitted", d)
	}
	if d, _ := decide(client.Request{Descriptors: map[string]string{"x": "1", "user": "bob"}}); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("bob again = %+v, want admitted with 0 left", d)
	}
	// 1.5s refill 0.75 tokens: not enough; 0.5s more: one token.
	clk.t = clk.t.Add(1500 * time.Millisecond)
	if d, _ := decide(alice); d.Allowed || d.RetryAfter != 500*time.Millisecond {
		t.Fatalf("after 1.5s = %+v, want denied, retry after 500ms", d)
	}
	clk.t = clk.t.Add(500 * time.Millisecond)
	if d, _ := decide(alice); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("after 2s = %+v, want admitted", d)
	}
	// Cost: 0 is 1; above burst, negative or another rule: invalid.
	for _, r := range []client.Request{
		{Rule: "per-user", Subject: "carol", Cost: 3},
		{Rule: "per-user", Subject: "carol", Cost: -1},
		{Rule: "other", Subject: "carol"},
	} {
		if _, err := decide(r); !errors.Is(err, client.ErrInvalid) {
			t.Errorf("%+v = %v, want ErrInvalid", r, err)
		}
	}
	if d, _ := decide(client.Request{Rule: "per-user", Subject: "carol", Cost: 2}); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("carol cost 2 = %+v, want admitted, nothing left", d)
	}
	// Rate 0: a fixed allowance, no wait helps.
	fixed := clienttest.Bucket("once", 1, 0, clk.now)
	fixed(alice)
	if d, _ := fixed(alice); d.Allowed || d.RetryAfter != 0 || d.Reset != 0 {
		t.Fatalf("rate 0, spent = %+v, want denied with no retry", d)
	}
}

// Allower records what it answers, can change its answers, and fails a
// done context as a Client does.
func TestAllower(t *testing.T) {
	var zero clienttest.Allower
	if d, err := zero.Allow(context.Background(), client.Request{}); err != nil || !d.Allowed || d.Reason != client.ReasonNoRule {
		t.Fatalf("zero Allower = %+v, %v; want admitted, no_rule", d, err)
	}
	a := clienttest.New(clienttest.Fixed(client.Decision{Rule: "r", Reason: client.ReasonUnavailable}))
	if d, _ := a.Allow(context.Background(), client.Request{Subject: "1"}); d.Status() != 503 {
		t.Fatalf("Fixed fail_closed = %+v, want 503", d)
	}
	a.SetDecide(clienttest.Unavailable())
	if _, err := a.Allow(context.Background(), client.Request{Subject: "2"}); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("Unavailable = %v, want ErrUnavailable", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := a.Allow(ctx, client.Request{Subject: "3"}); !errors.Is(err, context.Canceled) || errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("canceled = %v, want context.Canceled", err)
	}
	ctx, cancel = context.WithDeadline(context.Background(), time.Unix(1, 0))
	defer cancel()
	if _, err := a.Allow(ctx, client.Request{Subject: "4"}); !errors.Is(err, client.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("expired = %v, want ErrUnavailable and DeadlineExceeded", err)
	}
	got := a.Requests()
	if len(got) != 2 || got[0].Subject != "1" || got[1].Subject != "2" {
		t.Fatalf("Requests = %+v, want the two answered", got)
	}
}
