package sim

import (
	"bytes"
	"encoding/xml"
	"io"
	"math"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/ration-dev/ration/internal/lease"
)

// tiny is Small cut down to run in seconds under the race detector, with
// every fault of the schedule.
func tiny(seed uint64) Config {
	c := Small()
	c.Name = "tiny"
	c.Seed = seed
	c.AgentsPerRegion = 8
	c.Rate = 4000
	c.Duration = 60 * time.Second
	c.HotSubjects = 3
	return c
}

func run(t *testing.T, c Config) (*Report, string) {
	t.Helper()
	s, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := s.Run()
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	rep.Text(&b)
	return rep, b.String()
}

// One seed is one exact run: the whole report, byte for byte. Another seed
// is another run.
func TestSameSeedSameReport(t *testing.T) {
	_, a := run(t, tiny(3))
	_, b := run(t, tiny(3))
	if a != b {
		t.Fatalf("seed 3 gave two reports:\n%s\n----\n%s", a, b)
	}
	_, c := run(t, tiny(4))
	if a == c {
		t.Fatal("seeds 3 and 4 gave the same report: the seed does not reach the run")
	}
}

// The bounds hold through the whole fault schedule, budgets are used, and
// the schedule happened (elections, crashes, cut messages).
func TestTinyRunHoldsBounds(t *testing.T) {
	rep, text := run(t, tiny(1))
	if !rep.OK() {
		t.Fatalf("bounds broken:\n%s", text)
	}
	if rep.Stats.elections < 5+3 {
		t.Errorf("%d elections, want the 5 first ones and 3 after the faults", rep.Stats.elections)
	}
	if rep.Stats.crashes == 0 || rep.Stats.cut == 0 || rep.Stats.lost == 0 || rep.Stats.duplicated == 0 {
		t.Errorf("faults missing: %+v", rep.Stats)
	}
	for _, q := range rep.Quotas {
		if q.Admitted == 0 {
			t.Errorf("%s admitted nothing", q.ID)
		}
		if strings.HasPrefix(q.ID, ruleRegional) && !(q.Utilisation >= 0.9) {
			t.Errorf("%s: steady utilisation %v, want >= 0.9", q.ID, q.Utilisation)
		}
	}
	if len(rep.Shifts) != 4 {
		t.Errorf("%d demand shifts measured, want 4", len(rep.Shifts))
	}
	if !strings.Contains(text, "verdict: PASS") {
		t.Errorf("report does not say PASS:\n%s", text)
	}
}

// With the leaders' nudges modelled, the planner nudges (over the
// network, so some are lost or cut), the bounds still hold, and the same
// seed is still the same run.
func TestNudgesModelled(t *testing.T) {
	cfg := tiny(2)
	cfg.Nudges = true
	rep, text := run(t, cfg)
	if !rep.OK() {
		t.Fatalf("bounds broken with nudges:\n%s", text)
	}
	if rep.Stats.nudges == 0 {
		t.Errorf("no nudge sent:\n%s", text)
	}
	if !strings.Contains(text, "replay: go run ./cmd/ration-sim -config "+cfg.Name+" -seed 2 -nudges") {
		t.Errorf("the replay command does not carry -nudges:\n%s", text)
	}
	if _, again := run(t, cfg); again != text {
		t.Fatalf("seed 2 with nudges gave two reports:\n%s\n----\n%s", text, again)
	}
	off := tiny(2)
	if rep, _ := run(t, off); rep.Stats.nudges != 0 {
		t.Errorf("%d nudges sent with Nudges off", rep.Stats.nudges)
	}
}

func TestExcess(t *testing.T) {
	const step = 100_000 // 0.1s
	for _, tc := range []struct {
		name    string
		adm     []int32
		b, rate float64
		want    float64
	}{
		{"empty", nil, 10, 10, 0},
		{"burst exactly", []int32{10}, 10, 10, 0},
		{"burst plus one", []int32{11}, 10, 10, 1},
		{"at the rate", []int32{10, 1, 1, 1, 1}, 10, 10, 0},
		{"above the rate later", []int32{0, 0, 0, 10, 3}, 10, 10, 2},
		// Saving up: nothing for a second, then B + r*1s at once is not
		// allowed (the bucket holds at most B), but spread windows are.
		{"no saving beyond B", []int32{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 20}, 10, 10, 10},
		{"worst window in the middle", []int32{1, 1, 10, 5, 1, 1}, 10, 10, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := excess(tc.adm, step, tc.b, tc.rate); math.Abs(got-tc.want) > 1e-9 {
				t.Fatalf("excess = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"too few regions", func(c *Config) { c.Regions = 2 }, "regions 2"},
		{"no agents", func(c *Config) { c.AgentsPerRegion = 0 }, "agents per region 0"},
		{"drift past the holders' bound", func(c *Config) { c.AgentDrift = 0.001 }, "drift"},
		{"offset past the safety margin", func(c *Config) { c.CoordOffset = time.Second }, "safety margin"},
		{"shares above 1", func(c *Config) { c.GlobalShare = 0.7 }, "global share"},
		{"loss", func(c *Config) { c.Loss = 0.6 }, "loss probability"},
		{"zero lease period", func(c *Config) { c.LeasePeriod = 0 }, "lease period"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Small()
			tc.edit(&c)
			_, err := New(c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one naming %q", err, tc.want)
			}
		})
	}
	if err := Reference().Validate(); err != nil {
		t.Fatalf("the reference run is invalid: %v", err)
	}
}

func TestClockInverse(t *testing.T) {
	for _, c := range []clock{{0, 0}, {12345, 0.0005}, {-999, -0.0005}, {1e12, 0.0001}} {
		for _, at := range []int64{0, 1, 999_999, 123_456_789, 600_000_000} {
			v := c.trueAt(c.at(at))
			if c.at(v) != c.at(at) || (v > 0 && c.at(v-1) >= c.at(at)) {
				t.Fatalf("clock %+v: trueAt(at(%d)) = %d, not the first instant reading %d", c, at, v, c.at(at))
			}
		}
	}
}

func TestPlotsAreSVG(t *testing.T) {
	rep, _ := run(t, tiny(2))
	for name, fn := range map[string]func(w io.Writer) error{"admitted": rep.AdmittedSVG, "load": rep.LoadSVG} {
		var b bytes.Buffer
		if err := fn(&b); err != nil {
			t.Fatal(err)
		}
		d := xml.NewDecoder(&b)
		lines := 0
		for {
			tok, err := d.Token()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("%s: not well-formed XML: %v", name, err)
			}
			if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
				lines++
			}
		}
		if lines < 2 {
			t.Fatalf("%s: %d lines drawn", name, lines)
		}
	}
}

// excess is the brute-force maximum over every window, in one pass.
func TestExcessMatchesEveryWindow(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		adm := rapid.SliceOfN(rapid.Int32Range(0, 50), 0, 60).Draw(t, "adm")
		b := float64(rapid.IntRange(1, 100).Draw(t, "b"))
		rate := float64(rapid.IntRange(0, 300).Draw(t, "rate"))
		const step = 100_000
		want := 0.0
		for i := range adm {
			var sum float64
			for j := i; j < len(adm); j++ {
				sum += float64(adm[j])
				dt := float64(int64(j-i)*step) / 1e6
				want = math.Max(want, sum-b-rate*dt)
			}
		}
		if got := excess(adm, step, b, rate); math.Abs(got-want) > 1e-6*(1+want) && !(want > 0 && got == 0 && want <= 1e-9*(b+rate*float64(int64(len(adm))*step)/1e6)) {
			t.Fatalf("excess = %v, brute force %v", got, want)
		}
	})
}

// The Raft model: an entry that reached the followers but whose acks the
// leader never got (it crashed) is committed by the next leader, without
// an answer to its proposer; one that reached no follower is gone.
func TestNextLeaderCommitsLostTermEntries(t *testing.T) {
	c := tiny(1)
	c.Faults, c.Loss, c.Dup, c.Reorder = false, 0, 0, 0
	c.LocalBase, c.LocalJitter = 10*time.Millisecond, 0 // every message takes 10ms
	s, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	s.apply = newApplier()
	defer s.apply.stop()
	advance := func(d int64) { // to now+d, though no event be there
		t := s.now + d
		s.runUntil(t)
		s.now = t
	}
	g := s.groups[1]
	g.elect()
	advance(us(time.Second))
	if !g.ready {
		t.Fatal("no leader after a second")
	}
	qc := lease.QuotaConfig{Burst: 10, Rate: 1, LeasePeriod: 5_000_000, SafetyMargin: 100_000}
	grant := func(holder string) []lease.Command {
		return []lease.Command{lease.Grant{Holder: holder, Seq: 1, Quota: "q", Demand: 1, Config: &qc}}
	}
	answered := 0
	g.propose(grant("reached"), func(*commit) { answered++ })
	advance(12_000) // at the followers (10ms), its acks not back (20ms)
	g.propose(grant("lost"), func(*commit) { answered++ })
	advance(3_000)
	g.nodes[g.leader].alive = false
	g.loseLeader("test")
	advance(us(5 * time.Second))
	if !g.ready {
		t.Fatal("no new leader")
	}
	s.apply.drain(g)
	holders := map[string]bool{}
	for _, l := range g.st.Leases("q") {
		holders[l.Holder] = true
	}
	if !holders["reached"] || holders["lost"] {
		t.Errorf("leases of q held by %v, want the entry that reached the followers only", holders)
	}
	if answered != 0 {
		t.Errorf("%d proposers of the lost term answered, want none", answered)
	}
	if s.stats.lostCommitted != 1 || s.stats.lostDropped != 1 {
		t.Errorf("lost-term entries: %d committed, %d gone; want 1 and 1", s.stats.lostCommitted, s.stats.lostDropped)
	}
}
