package rlqs

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ration-dev/ration/internal/holder"
	"github.com/ration-dev/ration/internal/region"
	"github.com/ration-dev/ration/internal/rules"
)

// Funds is what the server needs of the agent's leases (holder.Leases).
type Funds interface {
	Now() int64
	Lend(ctx context.Context, r *rules.Rule, subject string, now int64, prev holder.Loan, held float64, plan holder.Plan) (loan holder.Loan, tokens, rate float64, ok bool)
	Repay(loan holder.Loan, lent, rate, back float64)
	Count(r *rules.Rule, subject string, n float64, now, over int64)
	// ValidUntil is when the agent's lease of (r, subject) may no longer
	// be spent, on Now (0: it holds none valid).
	ValidUntil(r *rules.Rule, subject string) int64
	// DownFor is how long the coordinators have been unreachable.
	DownFor() time.Duration
}

// Rules yields the rules in force (agent.RuleSource).
type Rules interface{ Current() *rules.Set }

// DomainKey is the key under which a stream's domain reaches the rules, as
// an RLS request's domain does (agent.EnvoyDomainKey).
const DomainKey = "domain"

// Bounds on what one client may make the agent hold.
const (
	// MaxCount bounds a report's allowed or denied count.
	MaxCount = 1 << 40
	// MaxElapsed bounds a report's time_elapsed.
	MaxElapsed = 24 * time.Hour
)

// Options tune a Server. Zero values take the defaults.
type Options struct {
	Funds Funds // nil: leased buckets get their rule's failure policy
	// Taker funds the assignments of the rules RLQS does not lend for
	// (take.go). nil: those rules are not enforced (each is logged once,
	// and its failure policy decides).
	Taker Taker
	// Region is the agent's region: a scope: global, mode: redis rule's
	// store bucket there is the region's share, which sizes its takes.
	Region region.ID
	Rules  Rules
	// Delta bounds the delivery of a message between the agent and Envoy
	// plus the lateness of Envoy's timers (default 200ms): an assignment
	// sent at s is applied by s+Delta and ends by s+Delta+TTL (tab.go).
	Delta time.Duration
	// Grace is how long after an assignment is over a report that closes
	// it is awaited before its reservation is forfeit (default 3s).
	Grace time.Duration
	// MaxTTL is the longest assignment TTL, whole seconds (default 5s).
	MaxTTL time.Duration
	// TakeTTL is the TTL of an assignment funded by a take, whole seconds
	// (default 2s, at most MaxTTL). Every take pays for the whole TTL and
	// gets nothing back, and is held that long (take.go): short. But a taken assignment is renewed only when it
	// would lapse before the next report, so a TTL of several report
	// intervals makes one take last several reports: 2s is the shortest
	// whole-second TTL that does so at reporting intervals up to about
	// 400ms.
	TakeTTL time.Duration
	// OpenTTL is the TTL of an ALLOW_ALL for a bucket no rule limits
	// (default 30s).
	OpenTTL time.Duration
	// FailTTL is the TTL of an assignment made by a failure policy or a
	// spent budget (default 1s): it is asked again at the next report.
	FailTTL time.Duration
	// AbandonAfter abandons a bucket that reported no request for this
	// long (default 1m).
	AbandonAfter time.Duration
	// MaxStreams and MaxBuckets bound the streams of the agent and the
	// buckets of one stream (defaults 256 and 1000).
	MaxStreams, MaxBuckets int
	// MaxClientStreams bounds the streams one connection holds open at
	// once (default 8, at most MaxStreams). Envoy's filter keeps one
	// stream; without the bound one connection could take every slot and
	// leave every Envoy refused.
	MaxClientStreams int
	// Silent ends a stream that has reported nothing for this long
	// (default 1m; its first report is due within a tenth of it, at least
	// 5s): a slot is for a client that reports.
	Silent time.Duration
	// SendTimeout ends a stream whose Envoy has not taken a response
	// within it (default 5s): a client that stops reading would otherwise
	// block its stream's handler in Send, and with it the abandoning of
	// its buckets and the settling of their reservations, for as long as
	// its connection stays open.
	SendTimeout time.Duration
	// NoCarry: the Envoys start a new, full bucket on every token bucket
	// assignment, even one of unchanged sizes (Envoys older than the
	// filter's global client, which carries such a bucket on). Every
	// assignment is then charged its whole max_tokens, as the bound needs
	// (tab.go); by default an unchanged one is charged nothing.
	NoCarry bool
	// MaxBucketBytes bounds the memory the bucket ids of all streams may
	// hold, as idBytes counts it (default 256MiB): a report whose new
	// buckets would pass it is refused. MaxStreams × MaxBuckets ids of
	// the largest size would otherwise hold tens of GB.
	MaxBucketBytes int64
	Tick           time.Duration // settling resolution (default 100ms)
	Logger         *slog.Logger
	Registry       prometheus.Registerer
}

func (o *Options) defaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.Delta, 200*time.Millisecond)
	def(&o.Grace, 3*time.Second)
	def(&o.MaxTTL, 5*time.Second)
	def(&o.TakeTTL, 2*time.Second)
	def(&o.OpenTTL, 30*time.Second)
	def(&o.FailTTL, time.Second)
	def(&o.AbandonAfter, time.Minute)
	def(&o.Tick, 100*time.Millisecond)
	def(&o.SendTimeout, 5*time.Second)
	if o.MaxBucketBytes <= 0 {
		o.MaxBucketBytes = 256 << 20
	}
	o.MaxTTL = max(time.Second, o.MaxTTL.Truncate(time.Second))
	o.TakeTTL = min(o.MaxTTL, max(time.Second, o.TakeTTL.Truncate(time.Second)))
	o.OpenTTL = max(time.Second, o.OpenTTL.Truncate(time.Second))
	o.FailTTL = max(time.Second, o.FailTTL.Truncate(time.Second))
	if o.MaxStreams <= 0 {
		o.MaxStreams = 256
	}
	if o.MaxClientStreams <= 0 {
		o.MaxClientStreams = 8
	}
	o.MaxClientStreams = min(o.MaxClientStreams, o.MaxStreams)
	def(&o.Silent, time.Minute)
	if o.MaxBuckets <= 0 {
		o.MaxBuckets = 1000
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
}

// Server serves envoy.service.rate_limit_quota.v3.RateLimitQuotaService.
type Server struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer
	o       Options
	m       *metrics
	streams atomic.Int64
	start   time.Time
	// draining counts closed streams whose reservations are still out.
	draining atomic.Int64
	shares   shares
	// unenforced holds the names of the rules RLQS could not enforce
	// that a bucket has matched, each warned about once.
	unenforced sync.Map
	// rates integrates the refill rate lent to Envoys over time.
	rates rateLedger
	// idBytes is what the bucket ids of all streams hold (idBytes).
	idBytes atomic.Int64
	seq     atomic.Uint64 // buckets made so far
	// clients counts each client's open streams; refusals spaces out the
	// logging of refused and ended streams (clients.go).
	clients  clientStreams
	refusals refusalLog
	// stopping is closed by Stop: every stream ends.
	stopping chan struct{}
	stopOnce sync.Once
}

// errStopping ends the streams of an agent shutting down: Envoy opens
// its stream again, to another agent.
var errStopping = status.Error(codes.Unavailable, "rlqs: the agent is shutting down")

// Stop ends every stream, open or opened later. A stream otherwise lasts
// as long as its Envoy keeps it, and a graceful stop of the gRPC server
// waits for it: to the end of the shutdown's time limit, past which the
// agent no longer releases its leases.
func (s *Server) Stop() { s.stopOnce.Do(func() { close(s.stopping) }) }

// New builds a Server.
func New(o Options) *Server {
	o.defaults()
	s := &Server{o: o, m: newMetrics(o.Registry), start: time.Now(), shares: newShares(), stopping: make(chan struct{})}
	o.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "ration_rlqs_rate_tokens_total",
		Help: "Tokens RLQS assignments' refill rates (tokens_per_fill, lent out of the leases' own refill) could have added to Envoy's buckets: the rate lent, integrated over the time it was lent. With ration_rlqs_tokens_reserved_total less ration_rlqs_tokens_returned_total, the most this agent's Envoys can have admitted under its leases.",
	}, func() float64 { return s.rates.read(s.now()) }))
	o.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "ration_rlqs_bucket_id_bytes",
		Help: "Memory the bucket ids of all RLQS streams hold, roughly; a report whose new buckets would take it past the bound (256MiB) is refused.",
	}, func() float64 { return float64(s.idBytes.Load()) }))
	return s
}

// Register adds the service to g.
func (s *Server) Register(g *grpc.Server) { rlqsv3.RegisterRateLimitQuotaServiceServer(g, s) }

// now is the funds' clock (the holder's, which leases' validity is on).
func (s *Server) now() int64 {
	if s.o.Funds != nil {
		return s.o.Funds.Now()
	}
	return time.Since(s.start).Microseconds()
}

// Draining reports how many ended streams still hold reservations.
func (s *Server) Draining() int64 { return s.draining.Load() }

// StreamRateLimitQuotas serves one Envoy's stream: every report is
// answered with an action for each bucket it names; a timer settles
// reservations and abandons idle buckets in between.
func (s *Server) StreamRateLimitQuotas(g rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	select {
	case <-s.stopping:
		return errStopping
	default:
	}
	client := clientOf(g.Context())
	if !s.clients.take(client, s.o.MaxClientStreams) {
		s.m.refused.WithLabelValues("client_streams").Inc()
		s.refusals.log(s.o.Logger, "rlqs: a client's stream refused: it holds the most streams one client may", "client", client, "max", s.o.MaxClientStreams)
		return status.Errorf(codes.ResourceExhausted, "rlqs: this client (%s) holds %d streams, at most %d per client", client, s.o.MaxClientStreams, s.o.MaxClientStreams)
	}
	defer s.clients.give(client)
	if n := s.streams.Add(1); n > int64(s.o.MaxStreams) {
		s.streams.Add(-1)
		s.m.refused.WithLabelValues("streams").Inc()
		s.refusals.log(s.o.Logger, "rlqs: a stream refused: the agent holds the most streams it may", "client", client, "max", s.o.MaxStreams)
		return status.Errorf(codes.ResourceExhausted, "rlqs: %d streams open, at most %d per agent", n-1, s.o.MaxStreams)
	}
	s.m.streams.Inc()
	out := newSender(g, s.o.SendTimeout, s.stopping)
	st := &stream{s: s, out: out, buckets: map[string]*bucketState{}}
	defer func() {
		out.close()
		s.streams.Add(-1)
		s.m.streams.Dec()
		st.end()
	}()
	ctx := g.Context()
	reports := make(chan *rlqsv3.RateLimitQuotaUsageReports)
	errc := make(chan error, 1)
	go func() {
		for {
			r, err := g.Recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case reports <- r:
			case <-ctx.Done():
				errc <- ctx.Err()
				return
			}
		}
	}()
	t := time.NewTicker(s.o.Tick)
	defer t.Stop()
	renew := time.NewTimer(time.Hour)
	defer renew.Stop()
	// A stream must report: a silent one's slot is
	// given back (see Options.Silent).
	silent := time.NewTimer(max(5*time.Second, s.o.Silent/10))
	defer silent.Stop()
	for {
		select {
		case r := <-reports:
			if err := st.report(ctx, r); err != nil {
				return err
			}
			st.schedule(renew)
			silent.Reset(s.o.Silent)
		case <-silent.C:
			s.m.refused.WithLabelValues("silent").Inc()
			s.refusals.log(s.o.Logger, "rlqs: a silent stream ended: it reported nothing for its allowance", "client", client)
			return status.Errorf(codes.DeadlineExceeded, "rlqs: no report in time: a stream's slot is for a client that reports")
		case <-renew.C:
			if err := st.renew(ctx); err != nil {
				return err
			}
			st.schedule(renew)
		case <-t.C:
			if err := st.tick(); err != nil {
				return err
			}
		case err := <-errc:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-s.stopping:
			return errStopping
		}
	}
}

// stream is one Envoy's stream; only its handler's goroutine touches it.
type stream struct {
	s       *Server
	out     *sender
	domain  string
	buckets map[string]*bucketState
	retired []*fund // funds of gone buckets whose reservations are out
}

// bucketState is one bucket of the stream.
type bucketState struct {
	id        *rlqsv3.BucketId
	pairs     map[string]string // the bucket id plus the domain
	funds     map[string]*fund  // by rule and subject
	reported  int64             // when the last report naming it came
	busy      int64             // when it last reported a request
	abandoned bool
	// gap is the time between its reports as measured (see measureGap).
	gap int64
	// asked is the requests reported since askedSince, when the last
	// action was sent (acted: one was): its demand (see demand).
	asked      float64
	askedSince int64
	// sized is the demand its last answer to a report was sized for.
	sized float64
	// check is when renew next looks at its lease's validity (renewAt).
	check int64
	// retry is when a bucket denied until its lease can fund it is asked
	// about again (renewAt); 0: at its next report.
	retry int64
	acted bool
	// until is when the last action sent, if one that stands until it
	// is about to lapse (a funded token bucket, a spent quota's denial),
	// may expire at Envoy at the earliest (sent + TTL); 0 otherwise: the
	// next report is answered.
	until     int64
	shareKeys map[string]bool // quotas whose shares count it
	size      int64           // its id's bytes, as idBytes counts them
	// takenAt is, while the action built last for it is a token bucket a
	// take funds and not yet sent, when that take started (plan.takenAt).
	takenAt int64
	// last is the last action sent for it when that was a token bucket
	// (lastSent: when; 0 otherwise): an assignment of the same sizes is
	// one Envoy carries on (tab.carries).
	last     sizes
	lastSent int64
	seq      uint64 // the order buckets were made in (shares.ahead)
	// lent: the last action sent is a token bucket that loans alone
	// fund (no take): renew may send it again.
	lent bool
}

// fund is one leased (rule, subject) paying for a bucket's assignments:
// one tab per loan (a new lease of the quota starts a new tab; the old one
// drains).
type fund struct {
	rule    *rules.Rule
	subject string
	tabs    []*loanTab
	// turn is when the bucket's current run of loans of the quota began
	// (0: it holds none): it gives them up after a turn if others wait
	// (shares.turnOver).
	turn int64
}

type loanTab struct {
	loan holder.Loan
	t    *tab
}

// usage is one validated report entry.
type usage struct {
	key             string
	id              *rlqsv3.BucketId
	pairs           map[string]string
	allowed, denied float64
}

// report applies one report and answers it.
func (st *stream) report(ctx context.Context, r *rlqsv3.RateLimitQuotaUsageReports) error {
	domain, us, err := st.validate(r)
	if err != nil {
		return st.invalid(err)
	}
	fresh, size := 0, int64(0)
	for _, u := range us {
		if st.buckets[u.key] == nil {
			fresh++
			size += idBytes(u.pairs)
		}
	}
	if n := len(st.buckets) + fresh; n > st.s.o.MaxBuckets {
		st.s.m.refused.WithLabelValues("buckets").Inc()
		return status.Errorf(codes.ResourceExhausted, "rlqs: %d buckets on one stream, at most %d (narrow the filter's bucket_id_builder)", n, st.s.o.MaxBuckets)
	}
	// Checked, then counted as each bucket is made (a bucket named twice
	// is made once): streams racing here may pass the bound by a report.
	if held := st.s.idBytes.Load() + size; held > st.s.o.MaxBucketBytes {
		st.s.m.refused.WithLabelValues("buckets").Inc()
		return status.Errorf(codes.ResourceExhausted, "rlqs: this report's %d new buckets would make the agent's bucket ids hold %d bytes, at most %d (narrow the filter's bucket_id_builder)", fresh, held, st.s.o.MaxBucketBytes)
	}
	st.domain = domain
	// now is when the report arrived: what it counts is as of then (an
	// earlier receipt settles less, tab.go). Each action is recorded as
	// sent at its own time (assign), and actions already planned are
	// sent before a bucket's takes wait on a store, or once flushAfter
	// has passed since the oldest of them: nothing slow ages a loan, and
	// takes are held from their own start (send).
	now := st.s.now()
	resp := &rlqsv3.RateLimitQuotaResponse{}
	var acted []*bucketState // the bucket of each action in resp
	var oldest int64
	for _, u := range us {
		b := st.buckets[u.key]
		if b == nil {
			b = &bucketState{id: u.id, pairs: u.pairs, funds: map[string]*fund{}, busy: now, size: idBytes(u.pairs), seq: st.s.seq.Add(1)}
			st.s.idBytes.Add(b.size)
			st.buckets[u.key] = b
			st.s.m.buckets.Inc()
		}
		b.abandoned = false
		elapsed := now - b.reported
		if b.reported == 0 {
			elapsed = 0
		}
		b.reported = now
		b.measureGap(elapsed)
		if u.allowed+u.denied > 0 {
			b.busy = now
		}
		// Every tab of the bucket hears the whole count: more than its
		// own assignments' admissions only lowers what it gives back.
		for _, f := range b.funds {
			if st.s.o.Funds != nil {
				st.s.o.Funds.Count(f.rule, f.subject, u.allowed+u.denied, now, elapsed)
			}
			for _, lt := range f.tabs {
				st.apply(lt, lt.t.report(now, u.allowed))
			}
		}
		b.asked += u.allowed + u.denied
		if !st.renewDue(b, now) {
			// Envoy's assignment carries on past the next report: a new
			// one would be charged its M again (tab.go), or taken again
			// whole (take.go).
			continue
		}
		lend, take := st.match(b)
		if len(take) > 0 && len(acted) > 0 {
			if err := st.send(resp, acted); err != nil {
				return err
			}
			resp, acted = &rlqsv3.RateLimitQuotaResponse{}, nil
		}
		b.sized = b.demand(st.s.now())
		a, at := st.assign(ctx, b, b.sized, lend, take)
		if len(acted) == 0 {
			oldest = at
		}
		resp.BucketAction = append(resp.BucketAction, a)
		acted = append(acted, b)
		b.asked, b.askedSince, b.acted = 0, at, true
		if st.s.now()-oldest >= flushAfter.Microseconds() {
			if err := st.send(resp, acted); err != nil {
				return err
			}
			resp, acted = &rlqsv3.RateLimitQuotaResponse{}, nil
		}
	}
	return st.send(resp, acted)
}

// idBytes is what a bucket of id pairs holds, roughly: each entry's key
// and value twice (the id as received, and pairs) and a map entry's
// overhead, plus the bucket's own state.
func idBytes(pairs map[string]string) int64 {
	n := int64(512)
	for k, v := range pairs {
		n += 2*int64(len(k)+len(v)) + 64
	}
	return n
}

// flushAfter bounds how long a planned action waits for the rest of its
// report's actions before it is sent on its own response.
const flushAfter = 20 * time.Millisecond

// renewDue reports whether b needs a new action at now: unless the one
// it has stands (until) past the next report (expected a gap later, twice
// that for a late one) and delta.
func (st *stream) renewDue(b *bucketState, now int64) bool {
	return b.until == 0 || b.gap <= 0 || b.until-now <= 2*b.gap+st.s.o.Delta.Microseconds()
}

// demand is b's requests per second since its last action: over the
// whole time Envoy applied it, not only the last report's gap (a report
// it answers comes once an assignment would lapse). Before any action
// (the first report, which Envoy sends with a bucket's first request),
// what it counts is taken as one second's.
func (b *bucketState) demand(now int64) float64 {
	if !b.acted {
		return b.asked
	}
	return b.asked / max(minDemandWindow.Seconds(), float64(now-b.askedSince)/1e6)
}

// minDemandWindow keeps a burst of requests reported right after an
// action from reading as a huge rate.
const minDemandWindow = 100 * time.Millisecond

// measureGap adds a report gap of elapsed (0: the bucket's first report)
// to b's measure: the longest of the recent ones, a longer gap at once, a
// shorter one a quarter of the way, so that one early report (Envoy sends
// a new bucket's first at once, then its timer's) does not make the next
// seem near.
func (b *bucketState) measureGap(elapsed int64) {
	switch {
	case elapsed <= 0:
	case elapsed >= b.gap:
		b.gap = elapsed
	default:
		b.gap -= (b.gap - elapsed) / 4
	}
}

// send sends resp; acted names the bucket of each of its actions (nil:
// none to check). A token bucket funded by a take that started more than
// SendMargin ago is not sent: its take was held for SendMargin + TTL +
// Delta from its start, too short for an assignment sent now.
func (st *stream) send(resp *rlqsv3.RateLimitQuotaResponse, acted []*bucketState) error {
	if len(resp.BucketAction) == 0 {
		return nil
	}
	var now int64
	for i, b := range acted {
		if b.takenAt == 0 {
			continue
		}
		if now == 0 {
			now = st.s.now()
		}
		if now-b.takenAt > SendMargin.Microseconds() {
			resp.BucketAction[i] = st.late(b)
		}
		b.takenAt = 0
	}
	for _, a := range resp.BucketAction {
		st.s.m.assignments.WithLabelValues(kindOf(a)).Inc()
	}
	if err := st.out.send(resp); err != nil {
		if errors.As(err, new(unreadError)) {
			st.s.m.refused.WithLabelValues("unread").Inc()
		}
		return err
	}
	return nil
}

// late is the action sent for b in place of a taken assignment that
// could not be sent in time: a DENY_ALL for FailTTL, asked about again at
// the next report. The take is lost.
func (st *stream) late(b *bucketState) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	st.s.m.takes.WithLabelValues("late").Inc()
	b.until, b.lastSent = 0, 0
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId: b.id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: durationpb.New(st.s.o.FailTTL),
				RateLimitStrategy:    blanket(typev3.RateLimitStrategy_DENY_ALL),
			},
		},
	}
}

func kindOf(a *rlqsv3.RateLimitQuotaResponse_BucketAction) string {
	if a.GetAbandonAction() != nil {
		return "abandon"
	}
	s := a.GetQuotaAssignmentAction().GetRateLimitStrategy()
	if s.GetTokenBucket() != nil {
		return "token_bucket"
	}
	if s.GetBlanketRule() == typev3.RateLimitStrategy_DENY_ALL {
		return "deny_all"
	}
	return "allow_all"
}

// apply makes a tab's move on its lease.
func (st *stream) apply(lt *loanTab, m move) {
	if (m.repay > 0 || m.repayRate > 0) && st.s.o.Funds != nil {
		st.s.o.Funds.Repay(lt.loan, m.repay, m.repayRate, m.back)
		st.s.rates.change(st.s.now(), -m.repayRate)
		st.s.m.returned.Add(m.back)
		st.s.m.forfeit.Add(m.repay - m.back)
	}
}

// tick settles what is over, forgets drained tabs, and abandons buckets
// idle for AbandonAfter.
func (st *stream) tick() error {
	now := st.s.now()
	resp := &rlqsv3.RateLimitQuotaResponse{}
	idle := st.s.o.AbandonAfter.Microseconds()
	for k, b := range st.buckets {
		st.settle(b.funds, now)
		if (b.until == 0 || now >= b.until) && now-b.reported > 2*max(b.gap, time.Second.Microseconds())+st.s.o.Delta.Microseconds() {
			// No loan of its stands and its Envoy stopped reporting:
			// its demand (a claim made once, say) no longer dilutes the
			// shares of those that report.
			st.s.shares.drop(b)
		}
		if !b.abandoned && now-b.busy > idle {
			st.cutAll(b, now)
			b.abandoned, b.lastSent = true, 0
			resp.BucketAction = append(resp.BucketAction, &rlqsv3.RateLimitQuotaResponse_BucketAction{
				BucketId:     b.id,
				BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}},
			})
			for _, f := range b.funds {
				st.retired = append(st.retired, f)
			}
			st.s.shares.drop(b)
			delete(st.buckets, k)
			st.s.idBytes.Add(-b.size)
			st.s.m.buckets.Dec()
		}
	}
	st.retired = st.settleRetired(st.retired, now)
	return st.send(resp, nil)
}

// settle settles every tab of funds at now and drops drained ones (all
// but a fund's current tab).
func (st *stream) settle(funds map[string]*fund, now int64) {
	for _, f := range funds {
		st.settleFund(f, now)
	}
}

func (st *stream) settleFund(f *fund, now int64) {
	keep := f.tabs[:0]
	for i, lt := range f.tabs {
		st.apply(lt, lt.t.settle(now))
		if !lt.t.empty() || i == len(f.tabs)-1 {
			keep = append(keep, lt)
		}
	}
	f.tabs = keep
}

func (st *stream) settleRetired(fs []*fund, now int64) []*fund {
	keep := fs[:0]
	for _, f := range fs {
		st.settleFund(f, now)
		for _, lt := range f.tabs {
			if !lt.t.empty() {
				keep = append(keep, f)
				break
			}
		}
	}
	return keep
}

// end closes the stream's tabs (no report will come) and settles them
// until every reservation has ended: at most MaxTTL + Delta later.
func (st *stream) end() {
	var fs []*fund
	for _, b := range st.buckets {
		for _, f := range b.funds {
			fs = append(fs, f)
		}
		st.s.shares.drop(b)
		st.s.idBytes.Add(-b.size)
	}
	st.s.m.buckets.Sub(float64(len(st.buckets)))
	st.buckets = nil
	fs = append(fs, st.retired...)
	now := st.s.now()
	for _, f := range fs {
		for _, lt := range f.tabs {
			st.apply(lt, lt.t.close(now))
		}
	}
	fs = st.settleRetired(fs, now)
	if len(fs) == 0 {
		return
	}
	st.s.draining.Add(1)
	go func() {
		defer st.s.draining.Add(-1)
		t := time.NewTicker(st.s.o.Tick)
		defer t.Stop()
		for len(fs) > 0 {
			<-t.C
			fs = st.settleRetired(fs, st.s.now())
		}
	}()
}
