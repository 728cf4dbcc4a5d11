package coordinator

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ration-dev/ration/internal/lease"
	"github.com/ration-dev/ration/internal/region"
)

// The status page: what an operator would otherwise piece together from
// coordinator status, quotas, leases and tunings, on the HTTP listener, as
// one read-only page (GET /) and the same data as JSON (GET /status.json).
// It reads this node's replicated state: on a follower it may lag the
// leader by the entries not yet applied, as the admin API does.
//
// The page is rendered on the server by html/template (every subject and
// holder comes from clients, so everything is escaped there); its small
// script only fetches the page's body again (GET /?part=body) every
// refresh and swaps it in, so the live view and the first view are the
// same rendering.

//go:embed status.html
var statusHTML string

var statusTmpl = template.Must(template.New("status").Funcs(template.FuncMap{
	"num": fmtNum,
	"dur": fmtDur,
	// ago writes a negative duration (a time past) as a positive one.
	"ago": func(s float64) string { return fmtDur(-s) },
}).Parse(statusHTML))

const (
	// statusEvery is how often the sampler reads the state for the charts.
	statusEvery = time.Second
	// statusHistory is how many samples a chart keeps: ten minutes.
	statusHistory = 600
	// statusCharted bounds the quotas with a chart, the busiest by
	// demand: a chart costs statusHistory samples (14 KB).
	statusCharted = 12
	// statusScan bounds the quotas one sample reads; beyond it a window
	// moves over the rest, so the sampler's time under the state's read
	// lock stays bounded with any number of subjects.
	statusScan = 5000
	// statusListed bounds the quotas the page and the JSON list (busiest
	// first); the admin API lists them all.
	statusListed = 200
	// statusElections is how many leader changes the page remembers.
	statusElections = 10
)

// statusSample is one second of one quota, in tokens/s.
type statusSample struct {
	at int64 // unix seconds
	// admitted is sum(min(demand, slice rate)) over the live leases: the
	// most the holders could have admitted at their reported demand.
	admitted float32
	demand   float32 // sum of the demands the holders reported
	leased   float32 // sum of the live leases' slice rates
	limit    float32 // the quota's rate r (with funding, for a funded quota)
}

// statusSeries is one charted quota's ring of samples.
type statusSeries struct {
	ring  [statusHistory]statusSample
	next  int     // where the next sample goes
	n     int     // samples held
	score float64 // moving average of demand, to rank quotas
	seen  bool    // found in the latest scan
}

func (s *statusSeries) add(v statusSample) {
	if s.n == 0 {
		s.score = float64(v.demand) // a new chart ranks by what it came in with
	}
	s.score = 0.9*s.score + 0.1*float64(v.demand)
	s.ring[s.next] = v
	s.next = (s.next + 1) % statusHistory
	s.n = min(s.n+1, statusHistory)
}

// samples returns the held samples, oldest first.
func (s *statusSeries) samples() []statusSample {
	out := make([]statusSample, 0, s.n)
	for i := range s.n {
		out = append(out, s.ring[(s.next-s.n+i+statusHistory)%statusHistory])
	}
	return out
}

// statusState is the page's memory in the node: the charts and the leader
// changes this node observed. Zero is ready to use.
type statusState struct {
	mu        sync.Mutex
	series    map[string]*statusSeries
	cursor    int // where the next scan window starts, past statusScan quotas
	elections []statusElection
}

type statusElection struct {
	At       time.Time `json:"at"`
	LeaderID string    `json:"leader_id"` // "" while no leader is known
	Term     uint64    `json:"term"`
}

// leaderChanged records a leader observation (watchLeaders).
func (s *statusState) leaderChanged(at time.Time, id string, term uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.elections = append(s.elections, statusElection{At: at, LeaderID: id, Term: term})
	if len(s.elections) > statusElections {
		s.elections = s.elections[len(s.elections)-statusElections:]
	}
}

// quotaTotals sums a quota's live leases.
type quotaTotals struct{ admitted, demand, leased float64 }

func totalsOf(leases []lease.LeaseInfo, now int64) quotaTotals {
	var t quotaTotals
	for _, l := range leases {
		if l.Expiry < now {
			continue // expired: no longer spending, only not reclaimed yet
		}
		t.admitted += math.Min(l.Demand, l.Rate)
		t.demand += l.Demand
		t.leased += l.Rate
	}
	return t
}

// sampleStatus records one sample per second for the busiest quotas until
// the node stops.
func (n *Node) sampleStatus() {
	defer n.wg.Done()
	t := time.NewTicker(statusEvery)
	defer t.Stop()
	for {
		select {
		case <-n.done:
			return
		case <-t.C:
			n.sampleOnce(n.clock())
		}
	}
}

func (n *Node) sampleOnce(at time.Time) {
	type reading struct {
		name string
		v    statusSample
	}
	s := &n.status
	s.mu.Lock()
	tracked := make([]string, 0, len(s.series))
	for name := range s.series {
		tracked = append(tracked, name)
	}
	cursor := s.cursor
	s.mu.Unlock()

	var got []reading
	n.fsm.read(func(st *lease.State) {
		names := st.Quotas()
		if len(names) > statusScan {
			start := cursor % len(names)
			window := names[start:min(start+statusScan, len(names))]
			cursor = start + len(window)
			names = append(window, tracked...)
		}
		now := st.Now()
		for _, name := range names {
			q, ok := st.Quota(name)
			if !ok {
				continue
			}
			tot := totalsOf(st.Leases(name), now)
			got = append(got, reading{name, statusSample{
				at: at.Unix(), admitted: float32(tot.admitted), demand: float32(tot.demand),
				leased: float32(tot.leased), limit: float32(q.Effective().Rate),
			}})
		}
	})

	s.mu.Lock()
	defer s.mu.Unlock()
	s.cursor = cursor
	if s.series == nil {
		s.series = map[string]*statusSeries{}
	}
	for _, sr := range s.series {
		sr.seen = false
	}
	for _, r := range got {
		if sr := s.series[r.name]; sr != nil {
			if !sr.seen { // a tracked quota may be read twice in a window
				sr.add(r.v)
				sr.seen = true
			}
			continue
		}
		if r.v.demand <= 0 && len(s.series) >= statusCharted {
			continue
		}
		if len(s.series) >= statusCharted {
			// Full: a quota replaces the quietest only when clearly
			// busier, so two similar quotas do not take turns (each
			// change loses a chart's history).
			low, lowName := math.Inf(1), ""
			for name, sr := range s.series {
				if sr.score < low {
					low, lowName = sr.score, name
				}
			}
			if float64(r.v.demand) <= 2*low {
				continue
			}
			delete(s.series, lowName)
		}
		sr := &statusSeries{seen: true}
		sr.add(r.v)
		s.series[r.name] = sr
	}
	for name, sr := range s.series {
		if !sr.seen {
			delete(s.series, name) // the quota left the state (idle, removed by Tick)
		}
	}
}

// The view the page and /status.json show. Rates are tokens/s, caps and
// pools tokens, times RFC 3339 or seconds from now.
type statusView struct {
	Generated time.Time `json:"generated"`
	// This node and the group as it sees it.
	NodeID            string         `json:"node_id"`
	State             string         `json:"state"`
	Region            string         `json:"region,omitempty"`
	Upstream          string         `json:"upstream,omitempty"`
	LeaderID          string         `json:"leader_id"`
	LeaderAddress     string         `json:"leader_address"`
	Term              uint64         `json:"term"`
	CommitIndex       uint64         `json:"commit_index"`
	AppliedIndex      uint64         `json:"applied_index"`
	LastSnapshotIndex uint64         `json:"last_snapshot_index"`
	LastContact       string         `json:"last_contact"`
	Servers           []statusServer `json:"servers"`
	// UpstreamStatus is a regional group's link to the global group.
	UpstreamStatus *statusUpstream  `json:"upstream_status,omitempty"`
	Elections      []statusElection `json:"elections"`
	// Quotas, the busiest (by reported demand) first, at most statusListed.
	Quotas      []statusQuota  `json:"quotas"`
	QuotasTotal int            `json:"quotas_total"`
	Tunings     []statusTuning `json:"tunings"`
	Charted     int            `json:"charted_max"`
	// Outline is set when the view holds no names but the rules' (no
	// -status-details): subjects, holders, lease ids and tunings are left
	// out, and counted.
	Outline      bool `json:"outline,omitempty"`
	TuningsTotal int  `json:"tunings_total"`
}

type statusServer struct {
	ID       string `json:"id"`
	Address  string `json:"address"`
	Suffrage string `json:"suffrage"`
	Leader   bool   `json:"leader"`
	Self     bool   `json:"self"`
	// Health is self, reachable, unreachable or unknown (health.go), as
	// this node's probes of the member's admin address found it.
	Health string `json:"health"`
	// LastContact is the member's latest answer (absent: none since this
	// node started, or this node); LastContactAgo the seconds since.
	LastContact    *time.Time `json:"last_contact,omitempty"`
	LastContactAgo float64    `json:"last_contact_ago_s,omitempty"`
	ProbeError     string     `json:"probe_error,omitempty"`
	// AppliedIndex and Lag: the member's applied index at its latest
	// answer, and how many entries behind this node's commit index it was.
	AppliedIndex uint64  `json:"applied_index"`
	Lag          uint64  `json:"lag"`
	Version      string  `json:"version,omitempty"`
	Commit       string  `json:"commit,omitempty"`
	Uptime       float64 `json:"uptime_s,omitempty"` // 0: not known (not reachable)
}

type statusQuota struct {
	Name    string `json:"name"`
	Rule    string `json:"rule"`
	Subject string `json:"subject"`
	// Burst and Rate are the shape conservation holds it to (Funded:
	// its own part plus the upstream lease's).
	Burst      float64 `json:"burst"`
	Rate       float64 `json:"rate"`
	Funded     bool    `json:"funded,omitempty"`
	Pool       float64 `json:"pool"`
	LeasedCap  float64 `json:"leased_cap"`
	LeasedRate float64 `json:"leased_rate"`
	// Demand and Admitted are over the live leases: the demands the
	// holders last reported, and sum(min(demand, slice rate)).
	Demand   float64 `json:"demand"`
	Admitted float64 `json:"admitted"`
	// Denied is sum(max(0, demand - slice rate)) over the live leases: the
	// requests per second the holders reported wanting beyond their
	// slices, which they refused (at least, at the demand reported).
	Denied   float64       `json:"denied"`
	Period   float64       `json:"lease_period_s"`
	MinSlice float64       `json:"min_slice"`
	MaxSlice float64       `json:"max_slice"` // 0: no maximum
	Leases   []statusLease `json:"leases"`
	// LiveLeases and ExpiredLeases count the leases (live; expired, not
	// yet reclaimed), for the outline, which lists none.
	LiveLeases    int `json:"live_leases"`
	ExpiredLeases int `json:"expired_leases"`
	// History is the chart's samples, oldest first, for the quotas
	// charted (the busiest statusCharted).
	History []statusPoint `json:"history,omitempty"`
	Chart   *statusChart  `json:"-"`
}

type statusLease struct {
	ID     uint64 `json:"id"`
	Holder string `json:"holder"`
	// Kind is "agent", or "region" for a region's regional group.
	Kind string `json:"kind"`
	// Rate and Cap are the slice and burst share of the latest answer;
	// ReservedRate and ReservedCap what is still counted (larger while a
	// shrink is unconfirmed).
	Rate         float64 `json:"rate"`
	Cap          float64 `json:"cap"`
	ReservedRate float64 `json:"reserved_rate"`
	ReservedCap  float64 `json:"reserved_cap"`
	Demand       float64 `json:"demand"`
	// TargetRate and TargetCap are the fair share the next renewal moves
	// the lease towards (live leases only).
	TargetRate float64   `json:"target_rate"`
	TargetCap  float64   `json:"target_cap"`
	Expiry     time.Time `json:"expiry"`
	ExpiresIn  float64   `json:"expires_in_s"` // negative: expired, not yet reclaimed
	Live       bool      `json:"live"`
}

type statusPoint struct {
	At       int64   `json:"t"`
	Admitted float32 `json:"admitted"`
	Demand   float32 `json:"demand"`
	Leased   float32 `json:"leased"`
	Limit    float32 `json:"limit"`
}

type statusTuning struct {
	Rule   string `json:"rule"`
	Region string `json:"region"` // "" is the rule's default
	// Settings are the overridden settings, as name=value.
	Settings []string `json:"settings"`
	// Pending is a safe-share change the global group is still waiting
	// on the region to confirm: from SafePrev to SafeShare.
	Pending string `json:"pending,omitempty"`
}

// statusChart is one quota's SVG chart, laid out on the server.
type statusChart struct {
	W, H                    int
	Admitted, Demand, Limit string // polyline points
	Max                     float64
	Span                    string
	Start, Mid, End         string // times of the x axis, HH:MM:SS UTC
	Points                  int
	LastAdmitted, LastLimit float64
}

func (n *Node) statusView() statusView {
	now := n.clock()
	v := statusView{Generated: now, NodeID: n.cfg.ID, Region: n.cfg.Region, Upstream: n.cfg.Upstream, Charted: statusCharted}
	stats := n.raft.Stats()
	u := func(k string) uint64 { x, _ := strconv.ParseUint(stats[k], 10, 64); return x }
	v.State = n.raft.State().String()
	v.LeaderID, v.LeaderAddress = n.Leader()
	v.Term, v.CommitIndex, v.AppliedIndex, v.LastSnapshotIndex = u("term"), u("commit_index"), u("applied_index"), u("last_snapshot_index")
	v.LastContact = lastContactText(stats["last_contact"], v.State)
	v.Servers = n.serverViews(now, v.LeaderID)
	v.UpstreamStatus = n.upstreamView(now, v.State == "Leader")
	n.status.mu.Lock()
	v.Elections = append([]statusElection(nil), n.status.elections...)
	history := map[string][]statusSample{}
	for name, sr := range n.status.series {
		history[name] = sr.samples()
	}
	n.status.mu.Unlock()
	for i, j := 0, len(v.Elections)-1; i < j; i, j = i+1, j-1 {
		v.Elections[i], v.Elections[j] = v.Elections[j], v.Elections[i] // newest first
	}

	nowUs := now.UnixMicro()
	n.fsm.read(func(st *lease.State) {
		names := st.Quotas()
		v.QuotasTotal = len(names)
		type ranked struct {
			name   string
			demand float64
		}
		if len(names) > statusScan {
			// Too many to rank on every view: the charted (busiest)
			// quotas first, then the others by name.
			charted := make([]string, 0, len(history))
			for name := range history {
				charted = append(charted, name)
			}
			sort.Strings(charted)
			names = append(charted, names...)
		}
		rank := make([]ranked, 0, min(len(names), statusScan))
		listed := map[string]bool{}
		for _, name := range names {
			if listed[name] || len(rank) == statusScan {
				continue
			}
			listed[name] = true
			rank = append(rank, ranked{name, totalsOf(st.Leases(name), st.Now()).demand})
			if v.UpstreamStatus != nil {
				q, _ := st.Quota(name)
				v.UpstreamStatus.addFunding(q)
			}
		}
		sort.SliceStable(rank, func(i, j int) bool { return rank[i].demand > rank[j].demand })
		if len(rank) > statusListed {
			rank = rank[:statusListed]
		}
		for _, r := range rank {
			v.Quotas = append(v.Quotas, quotaView(st, r.name, nowUs))
		}
		for _, t := range st.Tunings() {
			v.Tunings = append(v.Tunings, tuningView(t))
		}
	})
	for i := range v.Quotas {
		q := &v.Quotas[i]
		if h := history[q.Name]; len(h) > 0 {
			q.History = make([]statusPoint, len(h))
			for k, s := range h {
				q.History[k] = statusPoint{At: s.at, Admitted: s.admitted, Demand: s.demand, Leased: s.leased, Limit: s.limit}
			}
			q.Chart = chartOf(h)
			// The key under the chart says what the table says now,
			// not the last sample's (up to a second older).
			q.Chart.LastAdmitted, q.Chart.LastLimit = q.Admitted, q.Rate
		}
	}
	v.TuningsTotal = len(v.Tunings)
	if !n.cfg.StatusDetails && !n.cfg.Dev {
		outline(&v)
	}
	return v
}

// outline takes out of v what the admin API keeps to operators (ListLeases,
// ListQuotas, ListTunings): holder names (which agents run, and where),
// lease ids (what a rogue holder would name), subjects (tenants' names) and
// tunings. The -http port is read without credentials, so the page keeps
// what a dashboard needs: the group's health, and each quota's rule, shape,
// rates and lease counts. A quota's subject becomes its place among the
// rule's quotas shown ("#2"), which says nothing of the tenant.
func outline(v *statusView) {
	v.Outline = true
	v.Tunings = nil
	nth := map[string]int{}
	for i := range v.Quotas {
		q := &v.Quotas[i]
		if q.Subject != "" {
			nth[q.Rule]++
			q.Subject = fmt.Sprintf("#%d", nth[q.Rule])
			q.Name = QuotaID(q.Rule, q.Subject)
		}
		q.Leases = nil
	}
}

func quotaView(st *lease.State, name string, nowUs int64) statusQuota {
	info, _ := st.Quota(name)
	eff := info.Effective()
	rule, subject, _ := strings.Cut(name, "|")
	q := statusQuota{
		Name: name, Rule: rule, Subject: subject, Burst: eff.Burst, Rate: eff.Rate, Funded: info.Funded,
		Pool: info.Pool, LeasedCap: info.ReservedCap, LeasedRate: info.ReservedRate,
		Period: float64(info.LeasePeriod) / 1e6, MinSlice: info.MinSlice, MaxSlice: info.MaxSlice,
	}
	targets := map[string]lease.Share{}
	if shares, _, _, _, ok := st.Shares(name); ok {
		for _, s := range shares {
			targets[s.Holder] = s
		}
	}
	leases := st.Leases(name)
	tot := totalsOf(leases, st.Now())
	q.Demand, q.Admitted = tot.demand, tot.admitted
	q.Denied = max(tot.demand-tot.admitted, 0)
	for _, l := range leases {
		kind := "agent"
		if _, ok := region.FromHolder(l.Holder); ok {
			kind = "region"
		}
		sl := statusLease{
			ID: l.ID, Holder: l.Holder, Kind: kind, Rate: l.Rate, Cap: l.Cap,
			ReservedRate: l.ReservedRate, ReservedCap: l.ReservedCap, Demand: l.Demand,
			Expiry: time.UnixMicro(l.Expiry).UTC(), ExpiresIn: float64(l.Expiry-nowUs) / 1e6,
			Live: l.Expiry >= st.Now(),
		}
		if t, ok := targets[l.Holder]; ok {
			sl.TargetRate, sl.TargetCap = t.TargetRate, t.TargetCap
		}
		q.Leases = append(q.Leases, sl)
		if sl.Live {
			q.LiveLeases++
		} else {
			q.ExpiredLeases++
		}
	}
	return q
}

// serveStatus serves the page (GET /, or only its body with ?part=body,
// for the page's refresh) and GET /status.json.
func (n *Node) serveStatus(mux *http.ServeMux) {
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		v := n.statusView()
		name := "page"
		if r.URL.Query().Get("part") == "body" {
			name = "body"
		}
		h := w.Header()
		h.Set("Content-Type", "text/html; charset=utf-8")
		h.Set("Cache-Control", "no-store")
		// Everything the page needs is in it: no other origin is
		// reachable from it, even through an injected attribute.
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:")
		h.Set("X-Content-Type-Options", "nosniff")
		if err := statusTmpl.ExecuteTemplate(w, name, v); err != nil {
			n.logger.Warn("status page", "err", err)
		}
	})
	mux.HandleFunc("GET /status.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(n.statusView()); err != nil {
			n.logger.Warn("status.json", "err", err)
		}
	})
}

// leaderTerm is the Raft term as the node knows it, for the elections list.
func leaderTerm(r *raft.Raft) uint64 {
	t, _ := strconv.ParseUint(r.Stats()["term"], 10, 64)
	return t
}
