package coordinator

import (
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// TestProbeHealth holds one member's health to what its probes answer:
// unknown until the first answer, reachable on an answer (with what it
// reported, and the lag against the commit index sent), still reachable
// after one failed probe, unreachable after two in a row (its details of
// the last answer kept, the error shown), reachable again on an answer;
// a member that answers but refuses the Status (an older version during
// a rolling upgrade) is up, its details unknown.
func TestProbeHealth(t *testing.T) {
	now := time.Unix(1000, 0)
	n := &Node{clock: func() time.Time { return now }}
	n.members.probes = map[string]*memberProbe{"b": {admin: "127.0.0.1:1"}}
	get := func() *memberProbe { c := *n.members.probes["b"]; return &c }
	refused := errors.New("connection refused")

	if h := get().health(); h != healthUnknown {
		t.Fatalf("before any probe: %s, want unknown", h)
	}
	n.recordProbe("b", 50, &rationv1.StatusResponse{AppliedIndex: 42, Version: "1.2.3", Commit: "abc", UptimeSeconds: 7}, nil)
	if p := get(); p.health() != healthReachable || p.lag != 8 || p.applied != 42 || p.version != "1.2.3" || p.uptime != 7*time.Second || !p.lastContact.Equal(now) {
		t.Fatalf("after an answer: %+v (%s)", p, p.health())
	}
	n.recordProbe("b", 40, &rationv1.StatusResponse{AppliedIndex: 42}, nil)
	if p := get(); p.lag != 0 {
		t.Fatalf("a member ahead of the commit index sent: lag %d, want 0", p.lag)
	}
	contact := now
	now = now.Add(time.Second)
	n.recordProbe("b", 50, nil, refused)
	if p := get(); p.health() != healthReachable {
		t.Fatalf("after one failed probe: %s, want still reachable", p.health())
	}
	now = now.Add(time.Second)
	n.recordProbe("b", 50, nil, status.Error(codes.Unavailable, "dial tcp: connection refused"))
	p := get()
	if p.health() != healthUnreachable || !p.lastContact.Equal(contact) || !strings.Contains(p.lastErr, "connection refused") {
		t.Fatalf("after two failed probes: %+v (%s), want unreachable, last contact kept, the error", p, p.health())
	}
	n.recordProbe("b", 50, &rationv1.StatusResponse{AppliedIndex: 50}, nil)
	if p := get(); p.health() != healthReachable || p.lastErr != "" {
		t.Fatalf("answering again: %+v (%s), want reachable", p, p.health())
	}
	n.recordProbe("b", 50, nil, refused)
	n.recordProbe("b", 60, nil, status.Error(codes.PermissionDenied, "admin calls need an operator certificate"))
	if p := get(); p.health() != healthReachable || p.version != "" || !strings.Contains(p.lastErr, "refused") {
		t.Fatalf("a member refusing the Status: %+v (%s), want reachable, details unknown", p, p.health())
	}
	// A member without an admin address is never probed: unknown.
	if h := (&memberProbe{}).health(); h != healthUnknown {
		t.Fatalf("no admin address: %s, want unknown", h)
	}
}

// TestFormatDuration: durations as people read them.
func TestFormatDuration(t *testing.T) {
	for _, tc := range []struct {
		s    float64
		want string
	}{
		{0, "0.0s"}, {0.44, "0.4s"}, {9.96, "10.0s"}, {12.7, "12s"}, {60, "1m"}, {192, "3m 12s"},
		{7500, "2h 5m"}, {3 * 86400, "3d"}, {4*86400 + 3*3600 + 59, "4d 3h"}, {-2.5, "-2.5s"}, {-90, "-1m 30s"},
	} {
		if got := fmtDur(tc.s); got != tc.want {
			t.Errorf("fmtDur(%v) = %q, want %q", tc.s, got, tc.want)
		}
	}
}

// TestStatusBodyDurations renders the page's body for a lease whose
// expiry passed while the state's clock stood still (an election: the
// lease is still live in the state): it reads "expired 3.2s ago", never a
// negative number; durations read as durations; raft's last contact too.
func TestStatusBodyDurations(t *testing.T) {
	v := statusView{NodeID: "n1", State: "Follower", LastContact: lastContactText("1m12.5s", "Follower"),
		Servers: []statusServer{{ID: "n1", Health: healthSelf, Self: true, Uptime: 7500}},
		Quotas: []statusQuota{{Name: "r|", Rule: "r", Period: 90, Rate: 10, Leases: []statusLease{
			{ID: 1, Holder: "a/1", Live: true, ExpiresIn: -3.2},
			{ID: 2, Holder: "b/1", Live: true, ExpiresIn: 75},
		}}}}
	var b strings.Builder
	if err := statusTmpl.ExecuteTemplate(&b, "body", v); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	for _, want := range []string{"expired 3.2s ago", ">1m 15s<", ">1m 30s<", ">2h 5m<", "1m 12s ago"} {
		if !strings.Contains(page, want) {
			t.Errorf("body lacks %q", want)
		}
	}
	if strings.Contains(page, "-3.2") {
		t.Errorf("body shows a negative expiry:\n%s", page)
	}
	if got := lastContactText("0", "Leader"); got != "this node leads" {
		t.Errorf("lastContactText on a leader = %q", got)
	}
	if got := lastContactText("never", "Follower"); got != "never" {
		t.Errorf("lastContactText(never) = %q", got)
	}
}
