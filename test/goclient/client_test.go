package goclient_test

import (
	"context"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ration-dev/ration/client"
	"github.com/ration-dev/ration/client/clienttest"
)

const clientRules = `
rules:
  - name: per-user
    match: {user: "*"}
    burst: 2
    rate: 1/h
`

func TestAllowDecisions(t *testing.T) {
	srv, _ := startAgent(t, clientRules)
	c := newClient(t, srv.GRPCAddr(), client.Options{})
	ctx := context.Background()
	alice := client.Request{Descriptors: map[string]string{"user": "alice"}}
	for i := 0; i < 2; i++ {
		d, err := c.Allow(ctx, alice)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed || d.Reason != client.ReasonOK || d.Rule != "per-user" || d.Limit != 2 || d.Remaining != int64(1-i) || d.Status() != 200 {
			t.Fatalf("Allow %d = %+v, want admitted by per-user with %d left", i, d, 1-i)
		}
		if d.Rate <= 0 || d.Rate*3600 < 0.999 || d.Rate*3600 > 1.001 {
			t.Fatalf("Rate = %v, want 1/3600", d.Rate)
		}
	}
	d, err := c.Allow(ctx, alice)
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed || d.Reason != client.ReasonOverLimit || d.RetryAfter <= 0 || d.RetryAfter > time.Hour || d.Status() != 429 {
		t.Fatalf("3rd Allow = %+v, want over_limit with a retry within the hour (429)", d)
	}
	if d, err := c.Allow(ctx, client.Request{Descriptors: map[string]string{"other": "x"}}); err != nil || !d.Allowed || d.Reason != client.ReasonNoRule || d.Rule != "" {
		t.Fatalf("unmatched = %+v, %v; want admitted, no_rule", d, err)
	}
	// Cost above burst can never succeed: ErrInvalid, nothing charged.
	if _, err := c.Allow(ctx, client.Request{Descriptors: map[string]string{"user": "bob"}, Cost: 3}); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("cost 3 of burst 2 = %v, want ErrInvalid", err)
	}
	// A batch: in order, an invalid item does not fail the others.
	ds, err := c.AllowBatch(ctx, []client.Request{
		{Descriptors: map[string]string{"user": "bob"}},
		{Descriptors: map[string]string{"user": "bob"}, Cost: -1},
		{Descriptors: map[string]string{"user": "bob"}, Cost: 2},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !ds[0].Allowed || ds[0].Remaining != 1 {
		t.Fatalf("batch[0] = %+v, want admitted with 1 left (bob was not charged by the invalid call)", ds[0])
	}
	if ds[1].Reason != client.ReasonInvalid || !errors.Is(ds[1].Err, client.ErrInvalid) {
		t.Fatalf("batch[1] = %+v, want invalid with ErrInvalid", ds[1])
	}
	if ds[2].Allowed || ds[2].Reason != client.ReasonOverLimit {
		t.Fatalf("batch[2] = %+v, want over limit (2 > 1 left)", ds[2])
	}
}

// A Stream against the agent: decisions in order on one stream, an
// invalid request failing alone.
func TestStreamDecisions(t *testing.T) {
	srv, _ := startAgent(t, clientRules)
	c := newClient(t, srv.GRPCAddr(), client.Options{Timeout: 10 * time.Second})
	s := c.AllowStream(context.Background())
	defer s.Close()
	ctx := context.Background()
	carol := client.Request{Descriptors: map[string]string{"user": "carol"}}
	for i := 0; i < 2; i++ {
		if d, err := s.Allow(ctx, carol); err != nil || !d.Allowed || d.Rule != "per-user" || d.Remaining != int64(1-i) {
			t.Fatalf("Stream.Allow %d = %+v, %v; want admitted with %d left", i, d, err, 1-i)
		}
	}
	if _, err := s.Allow(ctx, client.Request{Descriptors: map[string]string{"user": "carol"}, Cost: -1}); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("Stream.Allow cost -1 = %v, want ErrInvalid", err)
	}
	if d, err := s.Allow(ctx, carol); err != nil || d.Allowed || d.Reason != client.ReasonOverLimit || d.Status() != 429 {
		t.Fatalf("3rd Stream.Allow = %+v, %v; want over_limit on the same stream", d, err)
	}
}

// clienttest.Bucket answers what the agent answers for the same rule: the
// fake that importers test with is held to the real thing.
func TestBucketMatchesAgent(t *testing.T) {
	srv, _ := startAgent(t, clientRules)
	c := newClient(t, srv.GRPCAddr(), client.Options{Timeout: 10 * time.Second})
	fake := clienttest.New(clienttest.Bucket("per-user", 2, 1.0/3600, nil))
	ctx := context.Background()
	reqs := []client.Request{
		{Descriptors: map[string]string{"user": "dave"}},
		{Descriptors: map[string]string{"user": "dave"}},
		{Descriptors: map[string]string{"user": "dave"}},
		{Descriptors: map[string]string{"user": "erin"}, Cost: 2},
		{Descriptors: map[string]string{"user": "erin"}},
		{Rule: "per-user", Subject: "frank"},
		{Rule: "per-user", Subject: "frank", Cost: 3},
		{Rule: "per-user", Subject: "frank", Cost: -1},
	}
	near := func(a, b time.Duration) bool { return (a - b).Abs() <= time.Second }
	for i, r := range reqs {
		want, werr := c.Allow(ctx, r)
		got, gerr := fake.Allow(ctx, r)
		if errors.Is(werr, client.ErrInvalid) != errors.Is(gerr, client.ErrInvalid) || (werr == nil) != (gerr == nil) {
			t.Fatalf("request %d %+v: agent %v, fake %v", i, r, werr, gerr)
		}
		if werr != nil {
			continue
		}
		if got.Allowed != want.Allowed || got.Reason != want.Reason || got.Rule != want.Rule || got.Limit != want.Limit ||
			got.Remaining != want.Remaining || math.Abs(got.Rate-want.Rate) > 1e-12 || got.Status() != want.Status() ||
			!near(got.RetryAfter, want.RetryAfter) || !near(got.Reset, want.Reset) {
			t.Fatalf("request %d %+v:\n agent %+v\n fake  %+v", i, r, want, got)
		}
	}

	// And the middleware writes the same fields from either.
	describe := func(r *http.Request) (client.Request, bool) {
		return client.Request{Descriptors: map[string]string{"user": r.Header.Get("X-User-Id")}}, true
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	real := client.Middleware(c, describe, client.MiddlewareOptions{})(ok)
	faked := client.Middleware(fake, describe, client.MiddlewareOptions{})(ok)
	for i := 0; i < 3; i++ {
		var recs [2]*httptest.ResponseRecorder
		for j, h := range []http.Handler{real, faked} {
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			req.Header.Set("X-User-Id", "gina")
			recs[j] = httptest.NewRecorder()
			h.ServeHTTP(recs[j], req)
		}
		for _, name := range []string{"RateLimit-Policy", "RateLimit", "Retry-After"} {
			if a, f := recs[0].Header().Get(name), recs[1].Header().Get(name); a != f || recs[0].Code != recs[1].Code {
				t.Fatalf("request %d: agent %d %s: %q, fake %d %s: %q", i, recs[0].Code, name, a, recs[1].Code, name, f)
			}
		}
	}
}
