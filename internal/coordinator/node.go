package coordinator

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/ration-dev/ration/internal/grpcsafe"
	"github.com/ration-dev/ration/internal/region"
	"github.com/ration-dev/ration/internal/rules"
	"github.com/ration-dev/ration/internal/tlsfiles"
	"github.com/ration-dev/ration/internal/tokenfile"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// Node is one coordinator: a Raft server replicating the FSM, the leader
// duties when it leads (clock stamping, ticks, batching, LeaderElected), and
// its servers: the lease API (-grpc), the admin API on a listener of its
// own (-admin) and HTTP. Start builds one; Shutdown or Close ends it.
type Node struct {
	cfg    Config
	logger *slog.Logger
	clock  func() time.Time
	// tuneMu serializes Tunes from check to commit, so that two safe-share
	// changes cannot both pass the sum(safe) <= r check (safe.go).
	tuneMu sync.Mutex

	fsm      *FSM
	raft     *raft.Raft
	trans    *raft.NetworkTransport
	store    *raftboltdb.BoltStore
	raftAddr string

	grpcServer *grpc.Server
	grpcLis    net.Listener
	grpcAddr   string // advertised: what the member table holds
	// adminServer serves ration.v1.Admin alone, on its own listener.
	adminServer *grpc.Server
	adminLis    net.Listener
	adminAddr   string // advertised: what the member table holds
	httpServer  *http.Server
	httpLis     net.Listener

	reg *prometheus.Registry
	m   *metrics

	rules atomic.Pointer[rules.Set]
	// claims caches what each part of a default share's rules claims
	// of them (split.go).
	claims splitClaims
	// upClient talks to the global group (-upstream); nil otherwise.
	upClient *Client
	term     atomic.Pointer[term] // the current leadership term; nil when not leader
	// watch holds the holders' Watch streams (nudge.go); incs the agent
	// incarnations seen, for duplicate-id detection.
	watch watchers
	incs  incarnations
	// gate bounds the incarnations of one agent identity holding leases
	// (holdbound.go).
	gate incarnationGate
	// memberMu serialises membership changes on the leader (admin.go,
	// membership.go): AddVoter, RemoveServer, AllowMember, promotions.
	memberMu sync.Mutex
	lastNow  atomic.Int64 // the last timestamp this node stamped, µs
	tunings  tuningCache  // tuningOf's (tune.go)
	// status is the status page's charts and leader changes (status.go).
	status statusState
	// members is what the probes of the other members found (health.go);
	// started is when this node started, for its uptime.
	members memberHealth
	// upHealth is how this node's renewals upstream went, for the status
	// page of a regional group (status_upstream.go).
	upHealth upstreamHealth
	started  time.Time

	// handshakes log each listener's failed TLS handshakes (handshakeLog).
	handshakesMu sync.Mutex
	handshakes   map[string]*tlsfiles.HandshakeLog

	// tls is the node's TLS material; nil in plaintext (-insecure, -dev).
	tls *tlsfiles.Source
	// peers is what the Raft transport admits under TLS (raftpeers.go).
	peers *raftPeers
	// token is the admin token (-admin-token-file); nil without one.
	token *tokenfile.Token

	notify   chan bool
	observer *raft.Observer
	// hbObserver sees the leader's heartbeats to each peer fail and
	// resume (membership.go).
	hbObserver *raft.Observer
	done       chan struct{}
	// drain is closed when the node starts to stop: long-lived streams
	// (Watch) end, so that a graceful stop does not wait for them.
	drain     chan struct{}
	drainOnce sync.Once
	wg        sync.WaitGroup

	closeOnce sync.Once
	closeErr  error
	removeDir string // a temporary data dir to delete on close (StartDev)
}

// Start opens the node's stores, starts Raft and the servers, bootstraps
// or joins when configured, and returns. It does not wait for a leader
// (see WaitReady). reg receives the node's metrics and is what /metrics
// serves; nil means a new registry. Start returns every configuration
// problem at once.
func Start(ctx context.Context, cfg Config, logger *slog.Logger, reg *prometheus.Registry) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.DataDir == "" {
		return nil, fmt.Errorf("%w: -data-dir: must not be empty", ErrInvalidConfig)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	set := cfg.Rules
	if set == nil {
		var err error
		if set, err = rules.Load(cfg.RulesFile); err != nil {
			return nil, fmt.Errorf("coordinator: rules: %w", err)
		}
	}
	n := &Node{
		cfg:     cfg,
		logger:  logger.With("node_id", cfg.ID),
		clock:   time.Now,
		reg:     reg,
		started: time.Now(),
		notify:  make(chan bool, 16),
		done:    make(chan struct{}),
		drain:   make(chan struct{}),
	}
	n.rules.Store(set)
	n.checkSafeShares(set)
	if cfg.TLS.Enabled() {
		// A rotation must not make this node another (or no) member: its
		// peers would refuse it, or take it for that member.
		src, err := tlsfiles.Open(cfg.TLS, tlsfiles.Options{Logger: n.logger.With("component", "tls"), Interval: cfg.TLSReloadInterval,
			Check: func(leaf *x509.Certificate) error { return checkOwnIdentity(leaf, cfg) }})
		if err != nil {
			return nil, fmt.Errorf("coordinator: %w", err)
		}
		n.tls = src
		if err := checkOwnIdentity(src.Leaf(), cfg); err != nil {
			n.close()
			return nil, err
		}
		n.peers = &raftPeers{group: cfg.Group(), logger: n.logger.With("component", "raft-peers")}
		n.peers.joining.Store(cfg.Join != "")
	} else {
		warnPlaintext(n.logger, cfg)
	}
	if cfg.AdminTokenFile != "" {
		tok, err := tokenfile.Open(cfg.AdminTokenFile, tokenfile.Options{Logger: n.logger.With("component", "admin-token"), Interval: cfg.TLSReloadInterval})
		if err != nil {
			n.close()
			return nil, fmt.Errorf("coordinator: -admin-token-file: %w", err)
		}
		n.token = tok
	}
	if cfg.Upstream != "" {
		n.upClient = NewClient(cfg.UpstreamAddrs(), ClientOptions{Logger: n.logger.With("component", "upstream"), DialOptions: n.dialOptions(tlsfiles.GlobalGroup)})
	}
	if err := n.open(ctx); err != nil {
		n.close()
		return nil, err
	}
	return n, nil
}

func (n *Node) open(ctx context.Context) error {
	cfg := n.cfg
	if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
		return fmt.Errorf("coordinator: data dir: %w", err)
	}
	hl := newHclog(n.logger, "raft")

	// gRPC first: its advertised address goes into the member table.
	lis, err := net.Listen("tcp", cfg.GRPCAddr)
	if err != nil {
		return fmt.Errorf("coordinator: -grpc %s: %w", cfg.GRPCAddr, err)
	}
	n.grpcLis = lis
	n.grpcAddr = cfg.GRPCAdvertise
	if n.grpcAddr == "" {
		n.grpcAddr = lis.Addr().String()
	}
	if n.adminLis, err = net.Listen("tcp", cfg.AdminAddr); err != nil {
		return fmt.Errorf("coordinator: -admin %s: %w", cfg.AdminAddr, err)
	}
	n.adminAddr = cfg.AdminAdvertise
	if n.adminAddr == "" {
		n.adminAddr = n.adminLis.Addr().String()
	}

	var advertise net.Addr
	switch {
	case cfg.RaftAdvertise != "" && n.tls != nil:
		// Under TLS the name stays a name, resolved at every dial: peers
		// verify this node's certificate against the host they dial, and
		// a certificate names DNS names (a StatefulSet pod's issued by
		// cert-manager cannot name its Service's cluster IP).
		advertise = namedAddr(cfg.RaftAdvertise)
	case cfg.RaftAdvertise != "":
		a, err := net.ResolveTCPAddr("tcp", cfg.RaftAdvertise)
		if err != nil {
			return fmt.Errorf("coordinator: -raft-advertise %s: %w", cfg.RaftAdvertise, err)
		}
		advertise = a
	}
	tc := raftTransportConfig(hl.Named("transport"))
	if n.tls != nil {
		var layer *tlsStreamLayer
		if layer, err = newTLSStreamLayer(cfg.RaftAddr, advertise, n.tls, n.peers, n.handshakeLog("-raft")); err == nil {
			tc.Stream = layer
			n.trans = raft.NewNetworkTransportWithConfig(tc)
		}
	} else {
		n.trans, err = raft.NewTCPTransportWithConfig(cfg.RaftAddr, advertise, tc)
	}
	if err != nil {
		return fmt.Errorf("coordinator: -raft %s: %w", cfg.RaftAddr, err)
	}
	n.raftAddr = string(n.trans.LocalAddr())

	n.store, err = raftboltdb.New(raftboltdb.Options{Path: filepath.Join(cfg.DataDir, "raft.db")})
	if err != nil {
		return fmt.Errorf("coordinator: open raft log: %w", err)
	}
	logs, err := raft.NewLogCache(512, n.store)
	if err != nil {
		return fmt.Errorf("coordinator: log cache: %w", err)
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.DataDir, cfg.SnapshotRetain, hl.Named("snapshot"))
	if err != nil {
		return fmt.Errorf("coordinator: snapshot store: %w", err)
	}

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.ID)
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.LeaderLeaseTimeout
	rc.CommitTimeout = cfg.CommitTimeout
	rc.SnapshotInterval = cfg.SnapshotInterval
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.TrailingLogs = cfg.TrailingLogs
	rc.ShutdownOnRemove = true
	rc.NoLegacyTelemetry = true
	rc.Logger = hl
	rc.NotifyCh = n.notify

	n.fsm = NewFSM(n.logger.With("component", "fsm"), func(err error) {
		// Called from raft's FSM goroutine: raft.Shutdown waits for it, so
		// the node is closed from a new goroutine.
		go n.close()
	})
	hasState, err := raft.HasExistingState(logs, n.store, snaps)
	if err != nil {
		return fmt.Errorf("coordinator: read raft state: %w", err)
	}
	n.m = newMetrics(n)
	if err := n.m.register(n.reg); err != nil {
		return fmt.Errorf("coordinator: metrics: %w", err)
	}
	n.raft, err = raft.NewRaft(rc, n.fsm, logs, n.store, snaps, n.trans)
	if err != nil {
		return fmt.Errorf("coordinator: start raft: %w", err)
	}
	if n.peers != nil {
		n.peers.raft.Store(n.raft)
	}

	obs := make(chan raft.Observation, 16)
	n.observer = raft.NewObserver(obs, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	n.raft.RegisterObserver(n.observer)
	hb := make(chan raft.Observation, 256)
	n.hbObserver = raft.NewObserver(hb, false, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.FailedHeartbeatObservation, raft.ResumedHeartbeatObservation:
			return true
		}
		return false
	})
	n.raft.RegisterObserver(n.hbObserver)
	n.wg.Add(4)
	go n.watchLeadership()
	go n.watchLeaders(obs)
	go n.watchHeartbeats(hb)
	go n.probeMembers()

	switch {
	case cfg.Bootstrap && hasState:
		n.logger.Info("-bootstrap ignored: this node already has Raft state")
	case cfg.Bootstrap:
		err := n.raft.BootstrapCluster(raft.Configuration{Servers: []raft.Server{{
			Suffrage: raft.Voter, ID: raft.ServerID(cfg.ID), Address: n.trans.LocalAddr(),
		}}}).Error()
		if err != nil {
			return fmt.Errorf("coordinator: bootstrap: %w", err)
		}
		n.logger.Info("bootstrapped a new cluster", "raft_addr", n.raftAddr)
	}
	if ids := cfg.InitialMemberIDs(); cfg.Bootstrap && len(ids) > 0 && !hasState {
		// Before the admin API serves: a member of -initial-members
		// that joins at once must find itself registered.
		if err := n.seedMembers(ctx, ids); err != nil {
			return err
		}
	} else if cfg.Bootstrap && len(ids) > 0 {
		// A first start interrupted before they were registered.
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			if err := n.seedMembers(context.Background(), ids); err != nil && !errors.Is(err, ErrStopped) {
				n.logger.Warn("-initial-members not registered", "err", err)
			}
		}()
	}

	// The lease port serves Leases alone: the admin API, which can change
	// the membership and the bound, is on a listener of its own that a
	// NetworkPolicy (or loopback) keeps from the agents.
	n.grpcServer = grpc.NewServer(append(grpcsafe.ServerOptions(n.logger, n.m.grpcPanics.Inc),
		n.serverCreds("-grpc"), grpc.UnknownServiceHandler(notServed("-grpc")))...)
	rationv1.RegisterLeasesServer(n.grpcServer, &leasesServer{n: n})
	n.adminServer = grpc.NewServer(append(grpcsafe.ServerOptions(n.logger, n.m.grpcPanics.Inc),
		n.serverCreds("-admin"), grpc.ChainUnaryInterceptor(n.adminOnly), grpc.ChainStreamInterceptor(n.adminOnlyStream),
		grpc.UnknownServiceHandler(notServed("-admin")))...)
	rationv1.RegisterAdminServer(n.adminServer, &adminServer{n: n})
	for _, srv := range []struct {
		name string
		s    *grpc.Server
		lis  net.Listener
	}{{"gRPC", n.grpcServer, n.grpcLis}, {"admin gRPC", n.adminServer, n.adminLis}} {
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			if err := srv.s.Serve(srv.lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				n.logger.Error(srv.name+" server stopped", "err", err)
			}
		}()
	}

	if cfg.HTTPAddr != "" {
		if err := n.serveHTTP(); err != nil {
			return err
		}
	}

	if cfg.Join != "" && !hasState {
		if err := n.join(ctx); err != nil {
			return err
		}
	} else if cfg.Join != "" {
		n.logger.Info("-join ignored: this node already has Raft state, so it is (or was) a member")
	}
	n.logger.Info("coordinator started", "raft_addr", n.raftAddr, "grpc_addr", n.grpcAddr, "http_addr", n.HTTPAddr(), "admin_addr", n.adminAddr)
	return nil
}

// watchLeaders counts the leader changes this node observes.
func (n *Node) watchLeaders(obs chan raft.Observation) {
	defer n.wg.Done()
	for {
		select {
		case <-n.done:
			return
		case o := <-obs:
			lo := o.Data.(raft.LeaderObservation)
			n.m.leaderChanges.Inc()
			n.status.leaderChanged(n.clock(), string(lo.LeaderID), leaderTerm(n.raft))
			n.logger.Info("leader changed", "leader_id", string(lo.LeaderID), "leader_addr", string(lo.LeaderAddr))
		}
	}
}

// ID returns the node's Raft server id.
func (n *Node) ID() string { return n.cfg.ID }

// RaftAddr returns the address peers dial.
func (n *Node) RaftAddr() string { return n.raftAddr }

// GRPCAddr returns the advertised lease (gRPC) address.
func (n *Node) GRPCAddr() string { return n.grpcAddr }

// AdminAddr returns the advertised admin address.
func (n *Node) AdminAddr() string { return n.adminAddr }

// HTTPAddr returns the bound HTTP address, or "" when HTTP is off.
func (n *Node) HTTPAddr() string {
	if n.httpLis == nil {
		return ""
	}
	return n.httpLis.Addr().String()
}

// DataDir returns the directory holding the Raft log and snapshots.
func (n *Node) DataDir() string { return n.cfg.DataDir }

// Raft returns the Raft instance, for operations and tests (Stats,
// Snapshot, membership). Do not Apply to it directly: entries must be
// encoded as the FSM expects and stamped by the leader.
func (n *Node) Raft() *raft.Raft { return n.raft }

// FSM returns the node's state machine, for reading.
func (n *Node) FSM() *FSM { return n.fsm }

// Registry returns the registry the node's metrics are in.
func (n *Node) Registry() *prometheus.Registry { return n.reg }

// SetRules replaces the quota shapes (a reloaded rules file). A quota whose
// shape changed is reconfigured, through Raft, at its next renewal.
func (n *Node) SetRules(s *rules.Set) {
	if s != nil {
		n.rules.Store(s)
		n.checkSafeShares(s)
	}
}

// checkSafeShares logs every global leased rule whose safe shares sum above
// its rate: the rules file accepted it only under allow_overshoot, and cut
// off from the global group its regions may admit that much too many (the
// bound is exported as ration_coordinator_safe_overshoot_*).
func (n *Node) checkSafeShares(s *rules.Set) {
	for _, r := range s.Rules() {
		if r.Scope != region.ScopeGlobal || r.Mode != rules.ModeLeased {
			continue
		}
		if o := region.Overshoot(r.Burst, r.Rate, r.Regions); o.Rate > 0 || o.Burst > 0 {
			n.logger.Warn("safe shares exceed the rule (allow_overshoot): regions cut off from the global group may overshoot",
				"rule", r.Name, "overshoot_tokens_per_second", o.Rate, "overshoot_tokens", o.Burst)
		}
	}
}

// Ready reports whether this node can serve leases: it leads and has
// applied its LeaderElected entry.
func (n *Node) Ready() bool {
	t := n.term.Load()
	return t != nil && t.ready.Load()
}

// Leader returns the leader's Raft id and lease (gRPC) address as this
// node knows them ("" when unknown).
func (n *Node) Leader() (id, grpcAddr string) {
	id, grpcAddr, _ = n.leader()
	return id, grpcAddr
}

// LeaderAdmin returns the leader's Raft id and admin address as this node
// knows them ("" when unknown: also a leader that joined before admin
// addresses were recorded).
func (n *Node) LeaderAdmin() (id, adminAddr string) {
	id, _, adminAddr = n.leader()
	return id, adminAddr
}

func (n *Node) leader() (id, grpcAddr, adminAddr string) {
	_, lid := n.raft.LeaderWithID()
	if lid == "" {
		return "", "", ""
	}
	m := n.fsm.member(string(lid))
	return string(lid), m.GRPCAddr, m.AdminAddr
}

// WaitReady waits until this node is a ready leader, or another node is
// known to lead, whichever comes first; it returns the leader's id.
func (n *Node) WaitReady(ctx context.Context) (string, error) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if id, _ := n.Leader(); id != "" && (id != n.cfg.ID || n.Ready()) {
			return id, nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("coordinator: wait for a leader: %w", ctx.Err())
		case <-n.done:
			return "", ErrStopped
		case <-tick.C:
		}
	}
}

// Done is closed when the node has stopped (Shutdown, Close, or its state
// machine stopped on an entry it cannot apply: see Err).
func (n *Node) Done() <-chan struct{} { return n.done }

// Err returns why the node stopped by itself, or nil.
func (n *Node) Err() error { return n.fsm.Stopped() }

// Shutdown stops the node gracefully: a leader first hands leadership to
// another voter (so the cluster does not wait an election timeout), then
// in-flight RPCs finish, then Raft and the stores close. ctx bounds the
// graceful part; Close follows in any case.
func (n *Node) Shutdown(ctx context.Context) error {
	if n.raft != nil && n.raft.State() == raft.Leader {
		if servers, err := n.servers(); err == nil && len(servers) > 1 {
			errc := make(chan error, 1)
			go func() { errc <- n.raft.LeadershipTransfer().Error() }()
			select {
			case err := <-errc:
				if err != nil {
					n.logger.Warn("leadership transfer failed; the cluster will elect after a timeout", "err", err)
				} else {
					n.logger.Info("leadership transferred")
				}
			case <-ctx.Done():
				n.logger.Warn("leadership transfer timed out", "err", ctx.Err())
			}
		}
	}
	n.drainStreams()
	for _, srv := range []*grpc.Server{n.grpcServer, n.adminServer} {
		if srv == nil {
			continue
		}
		stopped := make(chan struct{})
		go func() { srv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-ctx.Done():
			srv.Stop()
		}
	}
	return n.close()
}

func (n *Node) drainStreams() { n.drainOnce.Do(func() { close(n.drain) }) }

// Close stops the node at once: no leadership transfer, connections cut.
// It is what a crash looks like to the rest of the cluster (the harness's
// Kill), minus the lost fsync.
func (n *Node) Close() error { return n.close() }

func (n *Node) close() error {
	n.closeOnce.Do(func() {
		n.drainStreams()
		close(n.done)
		if t := n.term.Swap(nil); t != nil {
			t.cancel()
		}
		var errs []error
		if n.grpcServer != nil {
			n.grpcServer.Stop()
		} else if n.grpcLis != nil {
			n.grpcLis.Close()
		}
		if n.adminServer != nil {
			n.adminServer.Stop()
		} else if n.adminLis != nil {
			n.adminLis.Close()
		}
		if n.httpServer != nil {
			n.httpServer.Close()
		}
		if n.raft != nil {
			n.raft.DeregisterObserver(n.observer)
			n.raft.DeregisterObserver(n.hbObserver)
			if err := n.raft.Shutdown().Error(); err != nil {
				errs = append(errs, fmt.Errorf("raft shutdown: %w", err))
			}
		}
		if n.trans != nil {
			// Close only stops the listener; pooled outbound connections
			// (and their goroutines) would outlive the node.
			n.trans.CloseStreams()
			n.trans.Close()
		}
		if n.store != nil {
			if err := n.store.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close raft log: %w", err))
			}
		}
		n.waitGoroutines()
		if n.upClient != nil {
			_ = n.upClient.Close()
		}
		if n.tls != nil {
			n.tls.Close()
		}
		if n.token != nil {
			n.token.Close()
		}
		if n.removeDir != "" {
			os.RemoveAll(n.removeDir)
		}
		if n.m != nil {
			n.m.unregister(n.reg)
		}
		n.logger.Info("coordinator stopped")
		n.closeErr = errors.Join(errs...)
	})
	return n.closeErr
}

// closeWait bounds how long Close waits for the node's goroutines once
// Raft has shut down.
const closeWait = 5 * time.Second

// waitGoroutines waits for the node's goroutines, at most closeWait.
// hashicorp/raft (v1.7.3) can shut down with a batch of committed entries
// handed to its FSM goroutine but not applied: their futures are never
// answered, and the goroutine answering proposals (respond) would wait on
// one forever, and Close with it. Past the bound Close goes on: the
// proposals' callers have gone with the stopped servers, and the process
// is stopping.
func (n *Node) waitGoroutines() {
	done := make(chan struct{})
	go func() { n.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(closeWait):
		n.logger.Warn("closing without waiting for goroutines still blocked after the Raft shutdown (an entry Raft never answered)", "waited", closeWait)
	}
}

// servers returns the Raft configuration's servers.
func (n *Node) servers() ([]raft.Server, error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, err
	}
	return f.Configuration().Servers, nil
}
