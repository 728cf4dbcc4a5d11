package coordinator_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/internal/buildinfo"
	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// healthWait bounds each wait for a member's health to change: a kill is
// seen after two failed probes a second apart, so this is generous for a
// loaded machine, and a test that fails waits no longer than this.
const healthWait = 20 * time.Second

// TestMemberHealth kills a follower, then the leader, of a real 3-node
// group: each time the (new) leader's Status (what coordinator members
// list prints), its /status.json and its metrics show the dead member
// unreachable, the living ones reachable, each with its version, uptime,
// last contact and applied index. A restarted member is reachable again.
func TestMemberHealth(t *testing.T) {
	c := harness.StartCoordinators(t, 3, testRules, noTicks, func(cfg *coordinator.Config) {
		cfg.HTTPAddr = "127.0.0.1:0"
	})
	li, _ := c.Leader(t)
	want := func(down ...int) map[string]string {
		m := map[string]string{}
		for i := range c.N() {
			m[fmt.Sprintf("node%d", i)] = "reachable"
		}
		for _, d := range down {
			m[fmt.Sprintf("node%d", d)] = "unreachable"
		}
		return m
	}

	waitHealth(t, c, li, want())
	// Every way an operator looks at the leader agrees, and the living
	// members report what they are.
	checkHealthViews(t, c, li, want())

	f := (li + 1) % 3
	c.Kill(f)
	waitHealth(t, c, li, want(f))
	checkHealthViews(t, c, li, want(f))

	c.Restart(f)
	// Every node sees every other (the restarted one too, once its
	// probes have started), followers as well as the leader.
	for i := range c.N() {
		waitHealth(t, c, i, want())
	}

	c.Kill(li)
	nl, _ := c.Leader(t)
	waitHealth(t, c, nl, want(li))
	checkHealthViews(t, c, nl, want(li))
}

// TestMemberHealthTLS: under mutual TLS and an admin token the members
// probe each other with their own certificates and the group's token, and
// see each other reachable.
func TestMemberHealthTLS(t *testing.T) {
	pki := harness.NewPKI(t)
	file, _ := harness.AdminToken(t)
	c := harness.StartCoordinatorsTLS(t, 3, testRules, pki, noTicks, func(cfg *coordinator.Config) {
		cfg.AdminTokenFile = file
	})
	li, _ := c.Leader(t)
	waitHealth(t, c, li, map[string]string{"node0": "reachable", "node1": "reachable", "node2": "reachable"})
}

// waitHealth polls node i's Status until every member has the health in
// want (the node itself: "self"), or fails at healthWait.
func waitHealth(t *testing.T, c *harness.Coordinators, i int, want map[string]string) {
	t.Helper()
	admin := c.Admin(t, i)
	self := c.Node(i).ID()
	deadline := time.Now().Add(healthWait)
	for {
		ctx := timeout(t, 5*time.Second)
		st, err := admin.Status(ctx, &rationv1.StatusRequest{})
		why := ""
		if err != nil {
			why = err.Error()
		} else {
			why = healthDiff(st.Servers, self, want)
		}
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node%d never showed the members' health %v: %s", i, want, why)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func healthDiff(servers []*rationv1.RaftServer, self string, want map[string]string) string {
	if len(servers) != len(want) {
		return fmt.Sprintf("%d servers, want %d", len(servers), len(want))
	}
	for _, s := range servers {
		w := want[s.Id]
		if s.Id == self {
			w = "self"
		}
		if s.Health != w {
			return fmt.Sprintf("%s is %q (%s), want %q", s.Id, s.Health, s.ProbeError, w)
		}
	}
	return ""
}

// checkHealthViews checks node i's Status, /status.json and metrics
// against want, once waitHealth has seen it: the views are read from the
// same probes, so they agree at once.
func checkHealthViews(t *testing.T, c *harness.Coordinators, i int, want map[string]string) {
	t.Helper()
	n := c.Node(i)
	ctx := timeout(t, 5*time.Second)
	st, err := c.Admin(t, i).Status(ctx, &rationv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	version := buildinfo.Get().Version
	if st.Version != version || st.UptimeSeconds <= 0 {
		t.Errorf("node%d's Status: version %q uptime %v, want %q and > 0", i, st.Version, st.UptimeSeconds, version)
	}
	for _, s := range st.Servers {
		switch h := want[s.Id]; {
		case s.Id == n.ID():
			if s.Health != "self" || s.Version != version || s.UptimeSeconds <= 0 || s.AppliedIndex == 0 {
				t.Errorf("%s (self): %v", s.Id, s)
			}
		case h == "reachable":
			if s.Version != version || s.UptimeSeconds <= 0 || s.LastContactUnixUs == 0 || s.AppliedIndex == 0 || s.ProbeError != "" {
				t.Errorf("%s (reachable): want version %q, uptime, last contact and applied index: %v", s.Id, version, s)
			}
		case h == "unreachable":
			// Seen before it died (it was a member of the started group).
			if s.ProbeError == "" || s.UptimeSeconds != 0 || s.LastContactUnixUs == 0 {
				t.Errorf("%s (unreachable): want the probe's error, no uptime, its last contact: %v", s.Id, s)
			}
		}
	}

	resp, err := http.Get("http://" + n.HTTPAddr() + "/status.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var js struct {
		Servers []struct {
			ID          string     `json:"id"`
			Health      string     `json:"health"`
			LastContact *time.Time `json:"last_contact"`
			Version     string     `json:"version"`
			Uptime      float64    `json:"uptime_s"`
		} `json:"servers"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&js); err != nil {
		t.Fatalf("status.json: %v", err)
	}
	for _, s := range js.Servers {
		w := want[s.ID]
		if s.ID == n.ID() {
			w = "self"
		}
		if s.Health != w || (w == "reachable") != (s.LastContact != nil && s.Uptime > 0) {
			t.Errorf("status.json of node%d: %+v, want %s", i, s, w)
		}
	}

	up := memberGauge(t, c.Registry(i), "ration_coordinator_member_up")
	for id, h := range want {
		v, ok := up[id]
		wantUp := 1.0
		if h == "unreachable" && id != n.ID() {
			wantUp = 0
		}
		if !ok || v != wantUp {
			t.Errorf("node%d: ration_coordinator_member_up{member=%q} = %v (exported %v), want %v", i, id, v, ok, wantUp)
		}
	}
	if lag := memberGauge(t, c.Registry(i), "ration_coordinator_member_lag_entries"); len(lag) == 0 {
		t.Errorf("node%d exports no ration_coordinator_member_lag_entries", i)
	}
}

// memberGauge reads a gauge labelled by member from reg.
func memberGauge(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "member" {
					out[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	if len(out) == 0 && !strings.HasPrefix(name, "ration_coordinator_member_") {
		t.Fatalf("%s: not a member gauge", name)
	}
	return out
}
