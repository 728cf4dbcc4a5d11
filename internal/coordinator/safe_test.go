package coordinator_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/admission"
	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/lease"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// tunings reads the replicated tuning table of a node, by rule/region.
func tunings(n *coordinator.Node) map[string]lease.Tuning {
	out := map[string]lease.Tuning{}
	n.ReadState(func(s *lease.State) {
		for _, t := range s.Tunings() {
			out[t.Key()] = t
		}
	})
	return out
}

// safeOf returns (safe share, pending) of rule g in region reg on n; -1
// when none is set.
func safeOf(n *coordinator.Node, reg string) (float64, bool) {
	t, ok := tunings(n)["g/"+reg]
	if !ok || t.SafeShare == nil {
		return -1, false
	}
	return *t.SafeShare, t.Pending()
}

// quotaShape returns the configured (burst, rate) of quota g|x on n.
func quotaShape(n *coordinator.Node) (b, r float64) {
	n.ReadState(func(s *lease.State) {
		q, _ := s.Quota("g|x")
		b, r = q.Burst, q.Rate
	})
	return b, r
}

// waitFor polls cond every 20ms for up to d, returning how long it took
// (0: never).
func waitFor(d time.Duration, cond func() bool) time.Duration {
	start := time.Now()
	for time.Since(start) < d {
		if cond() {
			return max(time.Since(start), time.Nanosecond)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return 0
}

// eu is cut off from the global group, then its safe share is raised from
// 20 to 30 on the global group. The raise stays pending (eu cannot hear it
// nor confirm), the global group leases as if eu had 30, and eu, past its
// slice, admits within its OLD safe share (20/s, with its safe burst) in
// every window; across both regions nothing exceeds B + r*T (sum of the
// counted safe shares 50 <= r 60). Healed, eu learns 30 and the change
// settles.
func TestSafeShareRaisePendingWhileCutOff(t *testing.T) {
	hr := startHierarchy(t, safeRules, 1, 1, 1, []string{"eu", "us"})
	const period = time.Second
	admin := adminOf(t, hr.global, 0)
	var cutAt, tunedAt, healAt atomic.Int64
	var tuneErr atomic.Value
	var pendingAtHeal atomic.Bool
	hr.drive("g", "x", 8*time.Second, func(a *regionAgent, at time.Duration) float64 {
		switch {
		case at >= 6*time.Second:
			if healAt.CompareAndSwap(0, int64(at)) {
				_, p := safeOf(hr.global.Node(0), "eu")
				pendingAtHeal.Store(p)
				hr.h.Heal("eu")
			}
		case at >= 1500*time.Millisecond:
			if tunedAt.CompareAndSwap(0, int64(at)) {
				_, err := admin.Tune(context.Background(), &rationv1.TuneRequest{Tuning: &rationv1.Tuning{Rule: "g", Region: "eu", SafeShare: f64(30)}})
				if err != nil {
					tuneErr.Store(err)
				}
			}
		case at >= time.Second:
			if cutAt.CompareAndSwap(0, int64(at)) {
				hr.h.Cut("eu")
			}
		}
		return 60
	})
	if err, _ := tuneErr.Load().(error); err != nil {
		t.Fatalf("Tune(eu safe_share 30): %v", err)
	}
	recs := hr.rec.Records()
	cut, heal := time.Duration(cutAt.Load()), time.Duration(healAt.Load())
	// From one period (and the margin) after the cut, eu's slice is gone:
	// every window of eu's admissions until the heal is within the old
	// safe share, burst 40*20/60 and rate 20.
	from := cut + period + 300*time.Millisecond
	var euRecs []admission.Record
	for _, r := range recs {
		if at := r.At - hr.origin; at >= from && at < heal && strings.HasPrefix(r.Agent, "eu-") {
			euRecs = append(euRecs, r)
		}
	}
	eu := admission.Check(euRecs, "g|x", 40*20.0/60, 20)
	all := admission.Check(recs, "g|x", 40, 60)
	t.Logf("cut [%v, %v], raise tuned at %v: eu admitted %v cut off past its slice (%.1f/s), overshoot of its old safe share %.3f; total overshoot %.3f",
		cut, heal, time.Duration(tunedAt.Load()), eu.Admitted, eu.Admitted/(heal-from).Seconds(), eu.Overshoot, all.Overshoot)
	if !pendingAtHeal.Load() {
		t.Errorf("the raise settled while eu was cut off: it must stay pending until eu can hear it")
	}
	if eu.Overshoot > 1e-6 {
		t.Errorf("eu, cut off with a raise pending, admitted beyond its OLD safe share: overshoot %.3f tokens in [%v, %v]", eu.Overshoot, eu.From, eu.To)
	}
	if eu.Admitted == 0 {
		t.Errorf("eu admitted nothing while cut off: it should fall to its safe share")
	}
	if all.Overshoot > 1e-6 {
		t.Errorf("admitted more than B + r*(t1-t0) with sum(safe) <= r: overshoot %.3f tokens in [%v, %v]", all.Overshoot, all.From, all.To)
	}
	// Healed (the drive ended 2s after the heal): the raise settles and eu
	// learns 30.
	took := waitFor(5*period, func() bool {
		g, pending := safeOf(hr.global.Node(0), "eu")
		l, _ := safeOf(hr.regions["eu"].Node(0), "eu")
		return g == 30 && !pending && l == 30
	})
	g, pending := safeOf(hr.global.Node(0), "eu")
	l, _ := safeOf(hr.regions["eu"].Node(0), "eu")
	if took == 0 {
		t.Fatalf("after the heal: global safe share %v pending %v, eu learned %v; want 30 settled and learned", g, pending, l)
	}
}

// Raising eu's safe share (20 -> 30) and lowering us's (20 -> 10) on the
// global group (3 nodes) takes effect in both regions and settles, the
// global group then leases r - 40; everything survives a restart of every
// coordinator of every group, and nothing is admitted beyond B + r*T
// meanwhile.
func TestSafeShareChangeTakesEffectAndSurvivesRestart(t *testing.T) {
	hr := startHierarchy(t, safeRules, 3, 1, 1, []string{"eu", "us"})
	const period = time.Second
	driveDone := make(chan struct{})
	go func() {
		defer close(driveDone)
		// Until quit: the regions want their shares through the restarts
		// (an idle regional quota is removed, and holds no upstream lease).
		hr.drive("g", "x", time.Minute, func(*regionAgent, time.Duration) float64 { return 60 })
	}()
	time.Sleep(2 * period)
	li, leader := hr.global.Leader(t)
	admin := adminOf(t, hr.global, li)
	ctx := context.Background()
	if _, err := admin.Tune(ctx, &rationv1.TuneRequest{Tuning: &rationv1.Tuning{Rule: "g", Region: "eu", SafeShare: f64(30)}}); err != nil {
		t.Fatalf("Tune(eu safe_share 30): %v", err)
	}
	tunedEU := time.Now()
	resp, err := admin.Tune(ctx, &rationv1.TuneRequest{Tuning: &rationv1.Tuning{Rule: "g", Region: "us", SafeShare: f64(10)}})
	if err != nil {
		t.Fatalf("Tune(us safe_share 10): %v", err)
	}
	tunedUS := time.Now()
	if resp.Tuning.GetSafeShare() != 10 || resp.Tuning.GetSafeSharePendingFrom() != 20 {
		t.Errorf("Tune(us) answered %v, want safe share 10 pending from 20", resp.Tuning)
	}
	// A lowering takes effect in the region at once (it learns 10); a raise
	// once the global group's leases fit r - 40 (eu learns 30).
	var usLearned, euLearned, usSettled, euSettled time.Duration
	waitFor(5*period, func() bool {
		if v, _ := safeOf(hr.regions["us"].Node(0), "us"); v == 10 && usLearned == 0 {
			usLearned = time.Since(tunedUS)
		}
		if v, _ := safeOf(hr.regions["eu"].Node(0), "eu"); v == 30 && euLearned == 0 {
			euLearned = time.Since(tunedEU)
		}
		if v, p := safeOf(leader, "us"); v == 10 && !p && usSettled == 0 {
			usSettled = time.Since(tunedUS)
		}
		if v, p := safeOf(leader, "eu"); v == 30 && !p && euSettled == 0 {
			euSettled = time.Since(tunedEU)
		}
		return usLearned > 0 && euLearned > 0 && usSettled > 0 && euSettled > 0
	})
	t.Logf("us (lowered): learned after %v, settled after %v; eu (raised): learned after %v, settled after %v", usLearned, usSettled, euLearned, euSettled)
	if usLearned == 0 || euLearned == 0 || usSettled == 0 || euSettled == 0 {
		t.Fatalf("within 5 periods: us learned %v settled %v, eu learned %v settled %v (0: not yet)", usLearned, usSettled, euLearned, euSettled)
	}
	if _, r := quotaShape(leader); r > 20+1e-9 {
		t.Errorf("global quota rate %v after both settled, want r - 40 = 20", r)
	}

	for _, g := range []*harness.Coordinators{hr.global, hr.regions["eu"], hr.regions["us"]} {
		for i := range g.N() {
			g.Shutdown(i)
		}
		for i := range g.N() {
			g.Restart(i)
		}
	}
	_, leader = hr.global.Leader(t)
	// Each node has replayed its log once it has the tunings again.
	waitFor(5*period, func() bool {
		a, _ := safeOf(leader, "us")
		b, _ := safeOf(hr.regions["eu"].Node(0), "eu")
		c, _ := safeOf(hr.regions["us"].Node(0), "us")
		return a == 10 && b == 30 && c == 10
	})
	for _, c := range []struct {
		n    *coordinator.Node
		reg  string
		want float64
	}{{leader, "eu", 30}, {leader, "us", 10}, {hr.regions["eu"].Node(0), "eu", 30}, {hr.regions["us"].Node(0), "us", 10}} {
		if v, p := safeOf(c.n, c.reg); v != c.want || p {
			t.Errorf("after restarting every node: %s's safe share %v (pending %v), want %v settled", c.reg, v, p, c.want)
		}
	}
	// The regions' quotas run at the new safe shares again.
	took := waitFor(5*period, func() bool {
		_, eu := quotaShape(hr.regions["eu"].Node(0))
		_, us := quotaShape(hr.regions["us"].Node(0))
		_, g := quotaShape(leader)
		return eu == 30 && us == 10 && g <= 20+1e-9
	})
	_, euR := quotaShape(hr.regions["eu"].Node(0))
	_, usR := quotaShape(hr.regions["us"].Node(0))
	_, gR := quotaShape(leader)
	t.Logf("after the restart: eu own rate %v, us own rate %v, global leases %v (after %v)", euR, usR, gR, took)
	if took == 0 {
		t.Errorf("after the restart: eu own rate %v, us %v, global %v; want 30, 10, 20", euR, usR, gR)
	}
	close(hr.quit)
	<-driveDone
	if rep := admission.Check(hr.rec.Records(), "g|x", 40, 60); rep.Overshoot > 1e-6 {
		t.Fatalf("overshoot %.3f tokens in [%v, %v] across safe-share changes and restarts", rep.Overshoot, rep.From, rep.To)
	}
}

// Bad safe-share tunings are refused with every problem named, and change
// nothing; a regional group refuses to set one; a sum above r needs
// allow_overshoot and is then exported.
func TestTuneSafeShareRefusesBadInput(t *testing.T) {
	const yaml = safeRules + `
  - name: local
    match: {k: "*"}
    burst: 10
    rate: 10
    mode: leased
`
	hr := startHierarchy(t, yaml, 1, 1, 0, []string{"eu"})
	admin := adminOf(t, hr.global, 0)
	ctx := context.Background()
	list := func() string {
		l, err := admin.ListTunings(ctx, &rationv1.ListTuningsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return l.String()
	}
	before := list()
	for _, tc := range []struct {
		req  *rationv1.TuneRequest
		want []string
	}{
		{&rationv1.TuneRequest{Tuning: &rationv1.Tuning{Rule: "g", Region: "eu", SafeShare: f64(50), Weight: f64(0)}},
			[]string{"safe_share 50", "sum to 70", "above its rate 60", "allow_overshoot", "weight 0"}},
		{&rationv1.TuneRequest{Tuning: &rationv1.Tuning{Rule: "g", SafeShare: f64(10)}}, []string{"safe_share: region required"}},
		{&rationv1.TuneRequest{Tuning: &rationv1.Tuning{Rule: "g", Region: "eu", SafeShare: f64(-1)}}, []string{"safe_share -1"}},
		{&rationv1.TuneRequest{Tuning: &rationv1.Tuning{Rule: "local", Region: "eu", SafeShare: f64(1)}}, []string{"scope: region"}},
		{&rationv1.TuneRequest{Tuning: &rationv1.Tuning{Rule: "g", Region: "ap", SafeShare: f64(1)}}, []string{`region "ap"`}},
		{&rationv1.TuneRequest{Tuning: &rationv1.Tuning{Rule: "g", Region: "eu", SafeShare: f64(1)}, Clear: true}, []string{"safe_share: cannot be cleared"}},
		{&rationv1.TuneRequest{Tuning: &rationv1.Tuning{Rule: "g", Region: "eu", SafeShare: f64(1), SafeSharePendingFrom: f64(2)}}, []string{"safe_share_pending_from"}},
	} {
		_, err := admin.Tune(ctx, tc.req)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("Tune(%v) = %v, want InvalidArgument", tc.req, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("Tune(%v) error %q does not name %q", tc.req, err, w)
			}
		}
	}
	if after := list(); after != before {
		t.Fatalf("refused tunings changed the table: %q -> %q", before, after)
	}
	// The regional group only learns safe shares.
	_, err := adminOf(t, hr.regions["eu"], 0).Tune(ctx, &rationv1.TuneRequest{Tuning: &rationv1.Tuning{Rule: "g", Region: "eu", SafeShare: f64(10)}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "global group") {
		t.Errorf("Tune(safe_share) on a regional group = %v, want InvalidArgument naming the global group", err)
	}
	// us has no regional group here, so a lowering of us never settles: a
	// second change while it is pending is refused.
	if _, err := admin.Tune(ctx, &rationv1.TuneRequest{Tuning: &rationv1.Tuning{Rule: "g", Region: "us", SafeShare: f64(5)}}); err != nil {
		t.Fatalf("Tune(us safe_share 5): %v", err)
	}
	mid := list()
	_, err = admin.Tune(ctx, &rationv1.TuneRequest{Tuning: &rationv1.Tuning{Rule: "g", Region: "us", SafeShare: f64(15)}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "still pending") {
		t.Errorf("second change while pending = %v, want InvalidArgument (still pending)", err)
	}
	if after := list(); after != mid {
		t.Fatalf("a refused change changed the table: %q -> %q", mid, after)
	}
	// Above r with allow_overshoot: accepted and exported. eu 20 -> 50,
	// us counted at 20 while its lowering is pending: 70/s, 10 above r.
	if _, err := admin.Tune(ctx, &rationv1.TuneRequest{Tuning: &rationv1.Tuning{Rule: "g", Region: "eu", SafeShare: f64(50)}, AllowOvershoot: true}); err != nil {
		t.Fatalf("Tune(eu safe_share 50, allow_overshoot): %v", err)
	}
	if rate := gaugeValue(t, hr.global.Registry(0), "ration_coordinator_safe_overshoot_tokens_per_second", "g"); rate != 10 {
		t.Errorf("overshoot bound %v tokens/s after allow_overshoot, want 10", rate)
	}
}
