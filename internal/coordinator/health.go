package coordinator

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/buildinfo"
	"github.com/ration-dev/ration/internal/tlsfiles"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// Member health: every node asks each other member of its Raft
// configuration for its Status (the admin API, at the address the member
// table records) once a second. Raft itself says nothing an operator can
// read about a member that stopped: the configuration keeps a dead voter
// as a voter, and hashicorp/raft keeps its per-follower contact times to
// itself. A probe of the admin port sees what an operator would (the
// process answers, its applied index, its build and uptime), from every
// node, leader or not: after the leader dies, the new leader's page shows
// it down.

const (
	// healthEvery is how often each member is probed, healthTimeout how
	// long one probe may take.
	healthEvery   = time.Second
	healthTimeout = time.Second
	// healthFailures is how many probes in a row must fail before a
	// member is shown unreachable: one lost probe is not an outage. A
	// killed member is shown unreachable within about
	// healthFailures x healthEvery.
	healthFailures = 2
)

// Health values, as RaftServer.health, the page and the CLI show them.
const (
	healthSelf        = "self"
	healthReachable   = "reachable"
	healthUnreachable = "unreachable"
	healthUnknown     = "unknown"
)

// memberProbe is what this node knows of one other member.
type memberProbe struct {
	admin       string    // the admin address probed
	lastContact time.Time // its latest answer; zero: none yet
	failures    int       // probes failed in a row since then
	lastErr     string    // the latest failure
	applied     uint64    // its applied index at its latest answer
	lag         uint64    // this node's commit index then, minus applied
	version     string
	commit      string
	uptime      time.Duration // as it reported at lastContact
}

// health reads a probe: reachable while its latest probe was answered,
// unreachable once healthFailures probes in a row failed.
func (p *memberProbe) health() string {
	switch {
	case p == nil || p.admin == "":
		return healthUnknown
	case p.failures >= healthFailures:
		return healthUnreachable
	case !p.lastContact.IsZero():
		return healthReachable
	}
	return healthUnknown
}

// memberHealth is the probes' table, and the connections they use (one
// per admin address, kept between probes).
type memberHealth struct {
	mu     sync.Mutex
	probes map[string]*memberProbe     // by server id
	conns  map[string]*grpc.ClientConn // by "<id>@<admin address>"
	// promoteAt is, on the leader, what each non-voter must show to be
	// promoted (membership.go); hbFailing the peers whose heartbeats from
	// this node, as leader, fail.
	promoteAt map[string]promotion
	hbFailing map[string]bool
}

// probeMembers probes the other members every healthEvery until the node
// stops.
func (n *Node) probeMembers() {
	defer n.wg.Done()
	t := time.NewTicker(healthEvery)
	defer t.Stop()
	defer n.members.closeConns()
	for {
		select {
		case <-n.done:
			return
		case <-t.C:
			n.probeOnce()
		}
	}
}

// probeOnce probes every other member of the configuration at once, and
// forgets the members that left it.
func (n *Node) probeOnce() {
	servers, err := n.servers()
	if err != nil {
		return
	}
	table := n.fsm.memberTable()
	h := &n.members
	h.mu.Lock()
	if h.probes == nil {
		h.probes = map[string]*memberProbe{}
		h.conns = map[string]*grpc.ClientConn{}
	}
	type target struct {
		id string
		cc *grpc.ClientConn
	}
	var targets []target
	keep := map[string]bool{}
	inUse := map[string]bool{}
	for _, s := range servers {
		id := string(s.ID)
		if id == n.cfg.ID {
			continue
		}
		keep[id] = true
		admin := table[id].AdminAddr
		p := h.probes[id]
		if p == nil || p.admin != admin {
			p = &memberProbe{admin: admin} // a new address: what was known of the old one no longer holds
			h.probes[id] = p
		}
		if admin == "" {
			continue // joined before admin addresses were recorded: nothing to probe
		}
		key := id + "@" + admin // the conn requires id's certificate
		inUse[key] = true
		cc := h.conns[key]
		if cc == nil {
			if cc, err = n.probeConn(admin, id); err != nil {
				p.failures++
				p.lastErr = err.Error()
				continue
			}
			h.conns[key] = cc
		}
		targets = append(targets, target{id, cc})
	}
	for id := range h.probes {
		if !keep[id] {
			delete(h.probes, id)
		}
	}
	for addr, cc := range h.conns {
		if !inUse[addr] {
			cc.Close()
			delete(h.conns, addr)
		}
	}
	h.mu.Unlock()

	// The commit index before the probes leave: a member that answers
	// with everything committed by then has no lag, whatever was
	// committed while the answer travelled.
	commit := n.raft.CommitIndex()
	ctx, cancel := context.WithTimeout(context.Background(), healthTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, tg := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := rationv1.NewAdminClient(tg.cc).Status(ctx, &rationv1.StatusRequest{})
			n.recordProbe(tg.id, commit, st, err)
		}()
	}
	wg.Wait()
	n.promoteCaughtUp(commit)
}

func (n *Node) recordProbe(id string, commit uint64, st *rationv1.StatusResponse, err error) {
	now := n.clock()
	h := &n.members
	h.mu.Lock()
	defer h.mu.Unlock()
	p := h.probes[id]
	if p == nil {
		return // left the configuration meanwhile
	}
	if err != nil {
		s, _ := status.FromError(err)
		switch s.Code() {
		case codes.PermissionDenied, codes.Unauthenticated, codes.Unimplemented:
			// The process answered: it is up, only it would not say
			// more (a member of a version before the probes, during a
			// rolling upgrade; another admin token).
			p.failures, p.lastContact = 0, now
			p.applied, p.lag, p.version, p.commit, p.uptime = 0, 0, "", "", 0
			p.lastErr = fmt.Sprintf("up, but its Status was refused (%s: %s): applied index, version and uptime unknown", s.Code(), s.Message())
			return
		}
		p.failures++
		p.lastErr = fmt.Sprintf("%s: %s", s.Code(), s.Message())
		return
	}
	p.failures, p.lastErr = 0, ""
	p.lastContact = now
	p.applied = st.GetAppliedIndex()
	p.lag = 0
	if commit > p.applied {
		p.lag = commit - p.applied
	}
	p.version, p.commit = st.GetVersion(), st.GetCommit()
	p.uptime = time.Duration(st.GetUptimeSeconds() * float64(time.Second))
}

// probeConn is a connection to member id's admin address with the node's
// own credentials: its certificate (a member of the group may ask
// another for its Status) and the group's admin token. The server must
// present id's own certificate: the token goes to no other, even one of
// the group, at an address a member record names. Reconnections are
// tried at least every second, so a member that comes back is seen within
// a probe or two.
func (n *Node) probeConn(addr, id string) (*grpc.ClientConn, error) {
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if n.tls != nil {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(n.tls.ClientCredentials("", tlsfiles.RequireMember(n.cfg.Group(), id)))}
	}
	if n.token != nil {
		opts = append(opts, grpc.WithPerRPCCredentials(n.token.PerRPCCredentials()))
	}
	opts = append(opts, grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: healthEvery},
		MinConnectTimeout: healthTimeout,
	}))
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("admin address %s: %w", addr, err)
	}
	return cc, nil
}

func (h *memberHealth) closeConns() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for addr, cc := range h.conns {
		cc.Close()
		delete(h.conns, addr)
	}
}

// memberStatus is one member's health as this node sees it.
type memberStatus struct {
	ID          string
	Health      string
	LastContact time.Time // zero: never (or this node)
	Error       string
	Applied     uint64
	Lag         uint64
	Version     string
	Commit      string
	Uptime      time.Duration // 0: not known
}

// memberStatuses returns the health of the configuration's servers, in
// its order: this node's own from itself, the others' from the probes.
func (n *Node) memberStatuses(servers []raft.Server) []memberStatus {
	now := n.clock()
	out := make([]memberStatus, len(servers))
	h := &n.members
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, s := range servers {
		id := string(s.ID)
		if id == n.cfg.ID {
			out[i] = n.selfStatus()
			continue
		}
		p := h.probes[id]
		ms := memberStatus{ID: id, Health: p.health()}
		if p != nil {
			ms.LastContact, ms.Applied, ms.Lag, ms.Version, ms.Commit = p.lastContact, p.applied, p.lag, p.version, p.commit
			ms.Error = p.lastErr // while reachable: what it would not say
			if p.admin == "" {
				ms.Error = "no admin address recorded: it joined from a version that did not record one"
			}
			if ms.Health == healthReachable {
				ms.Uptime = p.uptime + now.Sub(p.lastContact)
			}
		}
		out[i] = ms
	}
	return out
}

func (n *Node) selfStatus() memberStatus {
	bi := buildinfo.Get()
	commit, applied := n.raft.CommitIndex(), n.raft.AppliedIndex()
	ms := memberStatus{ID: n.cfg.ID, Health: healthSelf, Applied: applied, Version: bi.Version, Commit: shortCommit(bi.Commit), Uptime: n.uptime()}
	if commit > applied {
		ms.Lag = commit - applied
	}
	return ms
}

// uptime is how long this node has been running.
func (n *Node) uptime() time.Duration { return n.clock().Sub(n.started) }

// shortCommit shortens a VCS revision as git does; "" when unknown.
func shortCommit(c string) string {
	if c == buildinfo.UnknownCommit {
		return ""
	}
	if len(c) > 12 {
		return c[:12]
	}
	return c
}
