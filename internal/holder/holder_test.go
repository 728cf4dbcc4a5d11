package holder_test

import (
	"context"
	"log/slog"
	"math"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/admission"
	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/holder"
	"github.com/ration-dev/ration/internal/rules"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

const leasedRules = `
rules:
  - name: hot
    match: {k: "*"}
    burst: 40
    rate: 60
    mode: leased
    lease: {period: 1s}
`

func logger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

func rule(t *testing.T, yaml, name string) *rules.Rule {
	t.Helper()
	set, err := rules.Parse("rules.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	r, ok := set.Rule(name)
	if !ok {
		t.Fatalf("no rule %s", name)
	}
	return r
}

// startHolder runs a holder against the cluster until the test ends.
func startHolder(t *testing.T, c *harness.Coordinators, id string) *holder.Leases {
	t.Helper()
	h, _ := runHolder(t, c, holder.Options{Holder: id})
	return h
}

// runHolder runs a holder with options o (Client, Logger and timeouts
// filled in) until stop is called or the test ends; stop releases its
// leases and waits for it.
func runHolder(t *testing.T, c *harness.Coordinators, o holder.Options) (h *holder.Leases, stop func()) {
	t.Helper()
	return runHolderVia(t, c, o, nil)
}

// runHolderVia is runHolder with the holder's client made by via from the
// cluster's real client (nil: the real client itself).
func runHolderVia(t *testing.T, c *harness.Coordinators, o holder.Options, via func(*coordinator.Client) holder.Client) (h *holder.Leases, stop func()) {
	t.Helper()
	client := coordinator.NewClient(c.GRPCAddrs(), coordinator.ClientOptions{CallTimeout: time.Second, MaxAttempts: 3})
	o.Client = client
	if via != nil {
		o.Client = via(client)
	}
	o.Logger = logger(t).With("agent_id", o.Holder)
	if o.ColdStart == 0 {
		o.ColdStart = 2 * time.Second
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = 2 * time.Second
	}
	h, err := holder.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); h.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done; client.Close() }) }
	t.Cleanup(stop)
	return h, stop
}

// Three agents with skewed demand share one leased quota: over the whole
// run, in every window, they admit at most B + r*(t1-t0) together; and
// within two lease periods their rates converge to the max-min fair shares.
func TestSkewedDemandFairAndBounded(t *testing.T) {
	c := harness.StartCoordinators(t, 3, leasedRules)
	r := rule(t, leasedRules, "hot")
	rec := admission.NewRecorder()

	type agent struct {
		id     string
		offer  float64 // requests per second offered
		h      *holder.Leases
		admits int
	}
	agents := []*agent{{id: "a", offer: 80}, {id: "b", offer: 20}, {id: "c", offer: 5}}
	for _, a := range agents {
		a.h = startHolder(t, c, a.id)
	}
	const run = 4 * time.Second
	ctx := context.Background()
	var wg sync.WaitGroup
	for _, a := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			interval := time.Duration(float64(time.Second) / a.offer)
			start := time.Now()
			for i := 0; time.Since(start) < run && i < int(a.offer*run.Seconds())+10; i++ {
				// Open loop: the i-th request is due at start + i*interval.
				if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
					time.Sleep(d)
				}
				res, ok := a.h.Take(ctx, r, "x", 1, a.h.Now())
				if ok && res.Allowed {
					rec.Admit(a.id, "hot|x", 1)
					a.admits++
				}
			}
		}()
	}
	wg.Wait()

	rep := admission.Check(rec.Records(), "hot|x", r.Burst, r.Rate)
	t.Logf("admitted %v by %d/%d/%d, utilisation %.2f, worst window [%v, %v] overshoot %.3f",
		rep.Admitted, agents[0].admits, agents[1].admits, agents[2].admits, rep.Utilisation, rep.From, rep.To, rep.Overshoot)
	if rep.Overshoot > 1e-6 {
		t.Fatalf("admitted more than B + r*(t1-t0): overshoot %.3f tokens in [%v, %v]", rep.Overshoot, rep.From, rep.To)
	}

	// Max-min fair shares of r = 60 for demands 80, 20, 5: c gets 5, b 20,
	// a the remaining 35. Read what the leader granted each holder.
	_, leader := c.Leader(t)
	leases := listLeases(t, leader.AdminAddr())
	want := map[string]float64{"a": 35, "b": 20, "c": 5}
	for _, l := range leases {
		// The wire name is <agent id>/<incarnation>.
		id, _, _ := strings.Cut(l.Holder, "/")
		w, ok := want[id]
		if !ok {
			continue
		}
		t.Logf("holder %s: rate %.2f cap %.2f demand %.2f", l.Holder, l.Rate, l.Cap, l.Demand)
		if math.Abs(l.Rate-w) > 0.35*w+1 {
			t.Errorf("holder %s rate share = %.2f, want about %.0f (max-min fair)", id, l.Rate, w)
		}
		delete(want, id)
	}
	if len(want) > 0 {
		t.Errorf("no live lease for holders %v", want)
	}
}

// listLeases lists the leases at the admin listener addr (a node's
// AdminAddr).
func listLeases(t *testing.T, addr string) []*rationv1.LeaseStatus {
	t.Helper()
	resp, err := harness.AdminClient(t, addr).ListLeases(context.Background(), &rationv1.ListLeasesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Leases
}

// An agent cut off from every coordinator keeps spending its lease until
// its own local expiry, measured from when it sent the renewal, and not a
// moment after; its decisions then report no lease (the failure policy
// decides), and DownFor measures the outage.
func TestCutOffStopsAtLocalExpiry(t *testing.T) {
	c := harness.StartCoordinators(t, 3, leasedRules)
	r := rule(t, leasedRules, "hot")
	h := startHolder(t, c, "solo")
	ctx := context.Background()
	if _, ok := h.Take(ctx, r, "y", 1, h.Now()); !ok {
		t.Fatal("no lease after the cold start")
	}
	// Let a renewal or two happen, then cut every coordinator off.
	time.Sleep(700 * time.Millisecond)
	cut := h.Now()
	for i := 0; i < c.N(); i++ {
		c.Kill(i)
	}
	// The last renewal was sent before cut, so validity (< 1s term) ends
	// before cut + 1s. Spend until the lease says no.
	var lastOK int64
	for i := 0; i < 100000; i++ {
		now := h.Now()
		if now > cut+int64(3*time.Second/time.Microsecond) {
			t.Fatal("lease still valid 3s after the cut; term is 1s")
		}
		_, ok := h.Take(ctx, r, "y", 0.001, now)
		if !ok {
			break
		}
		lastOK = now
		time.Sleep(time.Millisecond)
	}
	if lastOK > cut+int64(time.Second/time.Microsecond) {
		t.Fatalf("spent %v after the cut, beyond one lease term (1s)", time.Duration(lastOK-cut)*time.Microsecond)
	}
	for i := 0; i < 5; i++ {
		if _, ok := h.Take(ctx, r, "y", 0.001, h.Now()); ok {
			t.Fatal("lease usable again after expiry with no coordinator")
		}
	}
	if h.DownFor() <= 0 {
		t.Fatal("DownFor() = 0 with every coordinator down")
	}
	t.Logf("spent until %v after the cut", time.Duration(lastOK-cut)*time.Microsecond)
}
