package coordinator_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/ration-dev/ration/internal/buildinfo"
	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

var update = flag.Bool("update", false, "write the status page screenshot to docs/images (make docs)")

// statusRules: one global quota the agents share, and a rule whose
// subjects come from clients, to show that the page escapes them.
const statusRules = `
rules:
  - name: export
    match: {endpoint: export}
    burst: 300
    rate: 60
    mode: leased
    lease: {period: 60s, min_slice: 1, max_slice: 50}
  - name: per-user
    match: {user: "*"}
    burst: 20
    rate: 5
    mode: leased
    lease: {period: 60s}
`

// pageLease and pageQuota are what the test reads from the rendered DOM.
type pageLease struct {
	Quota, ID, Holder, Rate, Cap, Demand, Expires string
}

type pageQuota struct {
	Quota, Subject, Rate, Burst, LeasedRate, LeasedCap string
	Admitted, Denied, Period, Legend, AxisStart        string
	AxisEnd                                            string
	ChartPoints                                        int
	HasImg                                             bool
}

type pageServer struct {
	ID, Address, Suffrage, Role        string
	Health, HealthText, Contact, Lag   string
	Applied, Version, Uptime, ProbeErr string
}

type pageTuning struct {
	Rule, Region, Settings string
}

type pageView struct {
	Tunings []pageTuning
	Marker  int
	NodeID  string
	Leader  string
	Term    string
	Servers []pageServer
	Quotas  []pageQuota
	Leases  []pageLease
}

// readPage is evaluated in the page: what it shows, by the class names
// status.html gives its cells. Marker is set once by the test: a reload
// would lose it.
const readPage = `(() => {
  const text = (el, sel) => { const e = el.querySelector(sel); return e ? e.textContent.trim() : ""; };
  const quotas = [], leases = [];
  for (const sec of document.querySelectorAll("section.quota")) {
    const pts = sec.querySelector("svg.chart polyline:last-of-type");
    quotas.push({Quota: sec.dataset.quota, Subject: text(sec, ".subject"),
      Rate: text(sec, "table.quota-shape td.rate"), Burst: text(sec, "table.quota-shape td.burst"),
      LeasedRate: text(sec, "table.quota-shape td.leased-rate"), LeasedCap: text(sec, "table.quota-shape td.leased-cap"),
      Admitted: text(sec, "table.quota-shape td.admitted"), Denied: text(sec, "table.quota-shape td.denied"),
      Period: text(sec, "table.quota-shape td.period"), Legend: text(sec, ".key span:first-child"),
      AxisStart: text(sec, ".axis .t-start"), AxisEnd: text(sec, ".axis .t-end"),
      ChartPoints: pts ? pts.getAttribute("points").trim().split(/\s+/).length : 0,
      HasImg: sec.querySelector("img") !== null});
    for (const tr of sec.querySelectorAll("tr.lease")) {
      leases.push({Quota: sec.dataset.quota, ID: tr.dataset.lease, Holder: tr.dataset.holder,
        Rate: text(tr, "td.rate"), Cap: text(tr, "td.cap"), Demand: text(tr, "td.demand"), Expires: text(tr, "td.expires")});
    }
  }
  return {Marker: window.__statusMarker || 0, NodeID: text(document, "#node-id"),
    Leader: text(document, "#leader"), Term: text(document, "#term"),
    Servers: [...document.querySelectorAll("tr.server")].map(tr => ({ID: tr.dataset.id,
      Address: text(tr, "td.address"), Suffrage: text(tr, "td.suffrage"), Role: text(tr, "td.role"),
      Health: tr.dataset.health, HealthText: text(tr, "td.health"), Contact: text(tr, "td.last-contact"),
      Lag: text(tr, "td.lag"), Applied: text(tr, "td.applied"), Version: text(tr, "td.version"),
      Uptime: text(tr, "td.uptime"), ProbeErr: text(tr, ".probe-error")})),
    Quotas: quotas, Leases: leases,
    Tunings: [...document.querySelectorAll("tr.tuning")].map(tr => ({Rule: text(tr, "td.rule"),
      Region: text(tr, "td.region"), Settings: text(tr, "td.settings")}))};
})()`

// TestStatusPage renders the coordinator status page in a real headless
// Chromium against a 3-node group with two agents holding leases: the page
// must show what the admin API answers (members, leader, term, every
// lease's slice, burst share and demand), update without a reload when a
// third agent takes a lease and one releases its own, and chart the quota.
func TestStatusPage(t *testing.T) {
	chromium := harness.RequireBinary(t, "chromium", "chromium")
	c := harness.StartCoordinators(t, 3, statusRules, func(cfg *coordinator.Config) {
		cfg.HTTPAddr = "127.0.0.1:0"
		cfg.StatusDetails = true
	})
	li, leader := c.Leader(t)
	ctx := timeout(t, 3*time.Minute)

	// The agents: real coordinator clients, each its own holder.
	client := c.Client(coordinator.ClientOptions{})
	export := &rationv1.QuotaRef{Rule: "export"}
	evil := &rationv1.QuotaRef{Rule: "per-user", Subject: `user=<img src=x onerror="window.__pwned=1">`}
	if *update {
		// The docs' screenshot shows a subject as a tenant's would look;
		// the escaping is checked by every run without -update.
		evil.Subject = "user=alice"
	}
	renew := func(h *holder, demand float64, quotas ...*rationv1.QuotaRef) {
		t.Helper()
		req := h.request(quotas, demand)
		// As an agent does, the same request again through an election
		// (elections are frequent with -race on a loaded machine).
		var resp *rationv1.RenewResponse
		var err error
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if resp, err = client.Renew(ctx, req); err == nil || time.Now().After(deadline) {
				break
			}
		}
		if err != nil {
			t.Fatalf("%s: Renew: %v", h.name, err)
		}
		for _, g := range resp.Grants {
			if g.Error != "" {
				t.Fatalf("%s: %v", h.name, g.Error)
			}
		}
		if err := h.adopt(req, resp); err != nil {
			t.Fatalf("%s: %v", h.name, err)
		}
	}
	a, b := newHolder("agent-a/1"), newHolder("agent-b/1")
	renew(a, 40, export, evil)
	renew(b, 10, export)
	renew(a, 40, export, evil) // towards the fair shares, now that b is there

	// The page of the leader, compared with the leader's own admin API.
	admin := harness.AdminClient(t, leader.AdminAddr())
	url := "http://" + leader.HTTPAddr() + "/"

	browser := startChromium(t, ctx, chromium)
	if err := chromedp.Do(browser, chromedp.EmulateViewport(1280, 900), chromedp.Navigate(url),
		chromedp.WaitVisible("#servers")); err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	if _, err := chromedp.Run(browser, chromedp.Evaluate[int](`window.__statusMarker = 7`)); err != nil {
		t.Fatalf("mark the page: %v", err)
	}
	read := func() pageView {
		t.Helper()
		v, err := chromedp.Run(browser, chromedp.Evaluate[pageView](readPage))
		if err != nil {
			t.Fatalf("read the page: %v", err)
		}
		if v.Marker != 7 {
			t.Fatalf("the page was reloaded (marker %d): the refresh must swap the body in place", v.Marker)
		}
		return v
	}
	// matches compares the page with the admin API's answers of now; the
	// page refreshes every 1.5s, so the test waits for it to catch up.
	matches := func(v pageView) string {
		st, err := admin.Status(ctx, &rationv1.StatusRequest{})
		if err != nil {
			t.Fatalf("Status: %v", err)
		}
		if v.NodeID != st.Id {
			return fmt.Sprintf("node %q, admin says %q", v.NodeID, st.Id)
		}
		if !strings.HasPrefix(v.Leader, st.LeaderId+" ") || !strings.Contains(v.Leader, st.LeaderAddress) {
			return fmt.Sprintf("leader %q, admin says %s at %s", v.Leader, st.LeaderId, st.LeaderAddress)
		}
		if v.Term != strconv.FormatUint(st.Term, 10) {
			return fmt.Sprintf("term %s, admin says %d", v.Term, st.Term)
		}
		if len(v.Servers) != len(st.Servers) || len(st.Servers) != 3 {
			return fmt.Sprintf("%d servers, admin says %d (want 3)", len(v.Servers), len(st.Servers))
		}
		for i, s := range st.Servers {
			p := v.Servers[i]
			role := ""
			if s.Id == st.LeaderId {
				role = "leader"
			}
			if p.ID != s.Id || p.Address != s.Address || p.Suffrage != s.Suffrage || !strings.HasPrefix(p.Role, role) {
				return fmt.Sprintf("server %d: %+v, admin says %v (role %q)", i, p, s, role)
			}
			if p.Health != s.Health {
				return fmt.Sprintf("server %s: health %q on the page, admin says %q", s.Id, p.Health, s.Health)
			}
		}
		qs, err := admin.ListQuotas(ctx, &rationv1.ListQuotasRequest{})
		if err != nil {
			t.Fatalf("ListQuotas: %v", err)
		}
		if len(v.Quotas) != len(qs.Quotas) {
			return fmt.Sprintf("%d quotas, admin says %d", len(v.Quotas), len(qs.Quotas))
		}
		for _, q := range qs.Quotas {
			p, ok := findQuota(v, q.Quota)
			switch {
			case !ok:
				return fmt.Sprintf("no quota %q on the page", q.Quota)
			case p.Rate != coordinator.FmtNum(q.Rate) || p.Burst != coordinator.FmtNum(q.Burst) ||
				p.LeasedRate != coordinator.FmtNum(q.LeasedRate) || p.LeasedCap != coordinator.FmtNum(q.LeasedCap):
				return fmt.Sprintf("quota %q: page %+v, admin %v", q.Quota, p, q)
			}
		}
		ls, err := admin.ListLeases(ctx, &rationv1.ListLeasesRequest{})
		if err != nil {
			t.Fatalf("ListLeases: %v", err)
		}
		if len(v.Leases) != len(ls.Leases) {
			return fmt.Sprintf("%d leases on the page, admin says %d", len(v.Leases), len(ls.Leases))
		}
		for _, l := range ls.Leases {
			var p *pageLease
			for i := range v.Leases {
				if v.Leases[i].ID == strconv.FormatUint(l.LeaseId, 10) {
					p = &v.Leases[i]
				}
			}
			if p == nil {
				return fmt.Sprintf("no lease %d (%s, %s) on the page", l.LeaseId, l.Holder, l.Quota)
			}
			if p.Quota != l.Quota || p.Holder != l.Holder || p.Rate != coordinator.FmtNum(l.Rate) ||
				p.Cap != coordinator.FmtNum(l.Cap) || p.Demand != coordinator.FmtNum(l.Demand) {
				return fmt.Sprintf("lease %d: page %+v, admin %v", l.LeaseId, *p, l)
			}
		}
		tu, err := admin.ListTunings(ctx, &rationv1.ListTuningsRequest{})
		if err != nil {
			t.Fatalf("ListTunings: %v", err)
		}
		if len(v.Tunings) != len(tu.Tunings) {
			return fmt.Sprintf("%d tunings on the page, admin says %d", len(v.Tunings), len(tu.Tunings))
		}
		for i, x := range tu.Tunings {
			p := v.Tunings[i]
			if p.Rule != x.Rule || (x.MinSlice != nil) != strings.Contains(p.Settings, "min_slice="+coordinator.FmtNum(x.GetMinSlice())+"/s") {
				return fmt.Sprintf("tuning %d: page %+v, admin %v", i, p, x)
			}
		}
		return ""
	}
	waitPage := func(what string, cond func(pageView) string) pageView {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			v := read()
			why := cond(v)
			if why == "" {
				return v
			}
			if time.Now().After(deadline) {
				t.Fatalf("page never showed %s: %s", what, why)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	holders := func(v pageView, quota string) map[string]bool {
		out := map[string]bool{}
		for _, l := range v.Leases {
			if l.Quota == quota {
				out[l.Holder] = true
			}
		}
		return out
	}
	exportID := coordinator.QuotaID("export", "")

	v := waitPage("the admin API's numbers", matches)
	if h := holders(v, exportID); len(h) != 2 || !h["agent-a/1"] || !h["agent-b/1"] {
		t.Fatalf("export holders on the page = %v, want agent-a/1 and agent-b/1", h)
	}
	// Subjects come from clients: shown as text, never as markup.
	p, ok := findQuota(v, coordinator.QuotaID(evil.Rule, evil.Subject))
	if !ok || p.Subject != evil.Subject || p.HasImg {
		// (In -update runs the subject is plain, and so is this check.)
		t.Fatalf("the client's subject is not shown as text: %+v (found %v)", p, ok)
	}
	if pwned, err := chromedp.Run(browser, chromedp.Evaluate[bool](`window.__pwned === 1`)); err != nil || pwned {
		t.Fatalf("markup in a subject ran: %v %v", pwned, err)
	}

	// A third agent takes a lease and b gives its own back: the open page
	// follows without a reload (read fails the test on one).
	cAgent := newHolder("agent-c/1")
	renew(cAgent, 25, export)
	release := &rationv1.ReleaseRequest{Holder: b.name, Seq: b.seq, Items: []*rationv1.RenewItem{
		{Quota: export, LeaseId: b.leases[exportID].LeaseId, Unused: b.leases[exportID].Cap},
	}}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, err := client.Release(ctx, release)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Release b: %v", err)
		}
	}
	// An operator's tuning, through whichever node leads now.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, ln := c.Leader(t)
		_, err := harness.AdminClient(t, ln.AdminAddr()).Tune(ctx, &rationv1.TuneRequest{Tuning: &rationv1.Tuning{Rule: "export", MinSlice: f64(2)}})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Tune export min_slice 2: %v", err)
		}
	}
	v = waitPage("agent-c/1 in, agent-b/1 out and the tuning", func(v pageView) string {
		if h := holders(v, exportID); len(h) != 2 || !h["agent-a/1"] || !h["agent-c/1"] {
			return fmt.Sprintf("export holders %v, want agent-a/1 and agent-c/1", h)
		}
		if len(v.Tunings) != 1 {
			return fmt.Sprintf("%d tunings, want export's", len(v.Tunings))
		}
		return matches(v)
	})

	// The chart: one sample a second from the sampler, with the times of
	// its axis, and a key that says what the table says; durations read
	// as durations, and no expiry is negative.
	clock := regexp.MustCompile(`^\d\d:\d\d:\d\d$`)
	v = waitPage("a chart of export with a few samples", func(v pageView) string {
		p, _ := findQuota(v, exportID)
		switch {
		case p.ChartPoints < 4:
			return fmt.Sprintf("export chart has %d points", p.ChartPoints)
		case !clock.MatchString(p.AxisStart) || !clock.MatchString(p.AxisEnd) || p.AxisStart >= p.AxisEnd:
			return fmt.Sprintf("export chart's axis from %q to %q, want two times, in order", p.AxisStart, p.AxisEnd)
		case p.Legend != "admitted ≤ "+p.Admitted+"/s":
			return fmt.Sprintf("export chart's key %q, the table's admitted %q", p.Legend, p.Admitted)
		case p.Denied == "" || p.Period != "1m":
			return fmt.Sprintf("export: denied %q, period %q (want 1m)", p.Denied, p.Period)
		}
		for _, l := range v.Leases {
			if strings.HasPrefix(l.Expires, "-") || !strings.HasSuffix(l.Expires, "s") {
				return fmt.Sprintf("lease %s expires %q", l.ID, l.Expires)
			}
		}
		return ""
	})

	// The JSON says the same as the page (same view).
	resp, err := http.Get("http://" + c.Node(li).HTTPAddr() + "/status.json")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var js struct {
		LeaderID string `json:"leader_id"`
		Quotas   []struct {
			Name    string `json:"name"`
			Leases  []struct{ Holder string }
			History []struct{ Limit float64 }
		}
	}
	if err := json.Unmarshal(body, &js); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("status.json: %d %v\n%s", resp.StatusCode, err, body)
	}
	found := false
	for _, q := range js.Quotas {
		if q.Name == exportID {
			found = len(q.Leases) == 2 && len(q.History) > 0 && q.History[len(q.History)-1].Limit == 60
		}
	}
	if js.LeaderID == "" || !found {
		t.Fatalf("status.json lacks export's two leases and history at limit 60:\n%s", body)
	}

	if *update {
		// For the docs: a few minutes' worth of chart is more telling
		// than a few seconds. The agents' demand swings for 45s.
		for i := range 45 {
			d := 30 + 25*math.Sin(float64(i)/5)
			renew(a, d, export, evil)
			renew(cAgent, 60-d, export)
			time.Sleep(time.Second)
		}
		waitPage("the last renewals", matches)
	}
	// Member health: every member reachable with its version, applied
	// index and uptime; a killed follower shown unreachable, with the
	// probe's error, on the open page, within a few probes.
	version := buildinfo.Get().Version
	waitPage("every member reachable", func(v pageView) string {
		for _, s := range v.Servers {
			want, text := "reachable", "reachable"
			if s.ID == leader.ID() {
				want, text = "self", "this node"
			}
			if s.Health != want || s.HealthText != text || !strings.HasPrefix(s.Version, version) || s.Uptime == "" || s.Applied == "" || s.Lag == "" {
				return fmt.Sprintf("server %+v, want %s with version %s, uptime, applied index and lag", s, want, version)
			}
			if want == "reachable" && !strings.HasSuffix(s.Contact, " ago") {
				return fmt.Sprintf("server %s: last contact %q", s.ID, s.Contact)
			}
		}
		return ""
	})
	killed := (li + 1) % 3
	c.Kill(killed)
	killedID := fmt.Sprintf("node%d", killed)
	waitPage(killedID+" unreachable", func(v pageView) string {
		for _, s := range v.Servers {
			switch {
			case s.ID == killedID:
				if s.Health != "unreachable" || !strings.HasPrefix(s.HealthText, "unreachable") || !strings.Contains(s.ProbeErr, "connection refused") || s.Uptime != "" {
					return fmt.Sprintf("killed %+v, want unreachable with the probe's error and no uptime", s)
				}
			case s.ID != leader.ID() && s.Health != "reachable":
				return fmt.Sprintf("living %+v, want reachable", s)
			}
		}
		return ""
	})

	png, err := chromedp.Run(browser, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	out := filepath.Join(t.TempDir(), "coordinator-status.png")
	if *update {
		out = filepath.Join("..", "..", "docs", "images", "coordinator-status.png")
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", out, len(png))
}

func findQuota(v pageView, name string) (pageQuota, bool) {
	for _, q := range v.Quotas {
		if q.Quota == name {
			return q, true
		}
	}
	return pageQuota{}, false
}

// startChromium starts a headless Chromium with a fresh profile and
// returns a browser context for it; both end at cleanup. Without the
// background-networking flags Chromium waits on services it cannot reach
// from a closed network.
func startChromium(t *testing.T, ctx context.Context, path string) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("no-default-browser-check", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() { cancelBrowser(); cancelAlloc() })
	// Start the browser now, so that a broken install fails here, named.
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start %s: %v (install it with apt-get install chromium)", path, err)
	}
	return bctx
}
