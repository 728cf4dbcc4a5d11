package coordinator

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/lease"
	"github.com/ration-dev/ration/internal/region"
	"github.com/ration-dev/ration/internal/rules"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// Grant.error texts. Agents branch on them with strings.HasPrefix.
const (
	// ItemErrLeaseExpired: the lease is not live for this holder (expired,
	// reclaimed, released, never granted): stop spending it, ask again with
	// lease_id 0.
	ItemErrLeaseExpired = "lease expired or unknown"
	// ItemErrUnknownQuota: the coordinator's rules have no leased rule of
	// that name (or the quota could not be configured).
	ItemErrUnknownQuota = "unknown quota"
	// ItemErrInvalid: the item itself is malformed (a quota name past the
	// limit, a value out of range, a duplicate): it was refused alone and
	// asking again unchanged is refused again.
	ItemErrInvalid = "invalid item"
	// ItemErrRetryGrant: the request was a retry of one already applied,
	// and only its last command's answer is kept, so this grant's answer is
	// lost. The lease exists; ask again with lease_id 0 and a new seq to
	// get its terms (its first balance is forfeit).
	ItemErrRetryGrant = "grant answer lost on retry"
	// ItemErrTooManySubjects: the rule's lease.max_subjects quotas exist
	// already, so this subject gets none: the rule's failure policy
	// applies. Ask again later (with lease_id 0): a quota goes once its
	// subject is idle (no lease, pool refilled), which makes room.
	ItemErrTooManySubjects = "too many subjects"
)

// QuotaID names the quota of rule applied to subject, as the state machine
// knows it. '|' cannot occur in a rule name, so the split is unambiguous.
func QuotaID(rule, subject string) string { return rule + "|" + subject }

// leasesServer serves ration.v1.Leases on the leader.
//
// One request maps to several state machine commands, all in one Raft
// entry: a Grant per item with lease_id 0 (in item order), numbered seq,
// seq+1, ..., then one Renew for the other items, numbered after all the
// grant items; or a Release per item, numbered seq+i. A request thus uses
// at most len(items) numbers, and the holder's next request must use a seq
// of at least seq + len(items). Items the coordinator's rules refuse keep
// their numbers (unused), so a retry with the same seq and items maps to
// the same commands; the state machine replays the last one's answer.
type leasesServer struct {
	rationv1.UnimplementedLeasesServer
	n       *Node
	streams streamCount // RenewStreams open per connection
}

func (s *leasesServer) Renew(ctx context.Context, req *rationv1.RenewRequest) (*rationv1.RenewResponse, error) {
	resp, err := s.renew(ctx, req)
	if err != nil {
		return nil, s.n.rpcError(ctx, err)
	}
	return resp, nil
}

// renew is Renew's work, for a unary call and for a call on a RenewStream;
// its errors are the node's, not yet mapped to a gRPC status (rpcStatus).
func (s *leasesServer) renew(ctx context.Context, req *rationv1.RenewRequest) (*rationv1.RenewResponse, error) {
	n := s.n
	if err := n.servable(); err != nil {
		return nil, err
	}
	if err := checkHolderRequest(req.GetHolder(), req.GetSeq(), len(req.GetItems()), n.cfg.MaxItems); err != nil {
		return nil, err
	}
	if err := n.authorizeHolder(ctx, req.GetHolder()); err != nil {
		return nil, err
	}
	if err := checkSeqAhead(req.GetSeq(), n.clock()); err != nil {
		return nil, err
	}
	n.seenHolder(ctx, req.Holder)
	set := n.rules.Load()
	plan := PlanRenew(req, func(ref *rationv1.QuotaRef, holder string) (string, lease.ConfigureQuota, float64, *lease.Bounds, string) {
		return n.quotaFor(set, ref, holder)
	})
	var results []OpResult
	if len(plan.Ops) > 0 {
		p := &proposal{kind: kindRenew, configs: plan.Configs, touched: plan.Touched, requester: req.Holder}
		for _, c := range plan.Ops {
			p.ops = append(p.ops, pendingOp{cmd: c})
		}
		done, err := n.admitIncarnation(req.Holder, plan.HasGrants())
		if err != nil {
			return nil, err
		}
		results, err = n.propose(ctx, p)
		done()
		if err != nil {
			return nil, err
		}
	}
	resp, _, err := plan.Answer(results)
	if err != nil || len(plan.Ops) == 0 {
		return resp, err
	}
	if id, isRegion := region.FromHolder(req.Holder); isRegion && n.cfg.Upstream == "" {
		n.settleSafe(ctx, set, id, req.Items, resp.Grants)
	}
	return resp, nil
}

func (s *leasesServer) Release(ctx context.Context, req *rationv1.ReleaseRequest) (*rationv1.ReleaseResponse, error) {
	n := s.n
	if err := n.servable(); err != nil {
		return nil, n.rpcError(ctx, err)
	}
	if err := checkHolderRequest(req.GetHolder(), req.GetSeq(), len(req.GetItems()), n.cfg.MaxItems); err != nil {
		return nil, n.rpcError(ctx, err)
	}
	if err := n.authorizeHolder(ctx, req.GetHolder()); err != nil {
		return nil, n.rpcError(ctx, err)
	}
	if err := checkSeqAhead(req.GetSeq(), n.clock()); err != nil {
		return nil, n.rpcError(ctx, err)
	}
	n.seenHolder(ctx, req.Holder)
	plan := PlanRelease(req)
	var results []OpResult
	if len(plan.Ops) > 0 {
		p := &proposal{kind: kindRelease}
		for _, c := range plan.Ops {
			p.ops = append(p.ops, pendingOp{cmd: c})
		}
		// What the releases free may be wanted at once by the other holders
		// of those quotas: the responder marks them once applied.
		n.fsm.read(func(s *lease.State) { p.touched = plan.Touched(s) })
		var err error
		if results, err = n.propose(ctx, p); err != nil {
			return nil, n.rpcError(ctx, err)
		}
	}
	resp, _, err := plan.Answer(results)
	if err != nil {
		return nil, n.rpcError(ctx, err)
	}
	return resp, nil
}

// errSeqReused: the state machine answered from its record for this seq,
// and the record is of a different request.
func errSeqReused(seq uint64) error {
	return fmt.Errorf("%w: seq %d was already used for a different request; sequence numbers must not be reused", lease.ErrStale, seq)
}

// FillGrant writes a lease's terms into its Grant (ItemErrLeaseExpired when
// there is none).
func FillGrant(g *rationv1.Grant, l *lease.Lease) {
	if l == nil {
		g.Error = ItemErrLeaseExpired
		return
	}
	g.LeaseId = l.ID
	g.Balance = l.Balance
	g.Cap = l.Cap
	g.Rate = l.Rate
	g.DurationUs = l.Term
}

// ItemError turns an answer that concerns one item into its Grant.error,
// or "" when the error concerns the whole request.
func ItemError(err error) string {
	switch {
	case errors.Is(err, lease.ErrLeaseExpired):
		return ItemErrLeaseExpired
	case errors.Is(err, lease.ErrUnknownQuota):
		return ItemErrUnknownQuota
	case errors.Is(err, lease.ErrTooManySubjects):
		return ItemErrTooManySubjects
	}
	return ""
}

// quotaFor resolves a quota reference of holder against the coordinator's
// rules: the quota id, its shape and the holder's weight (0: the default),
// or the item's error text.
//
// A scope: global, mode: leased rule has three shapes (docs/architecture.md,
// Regions). In a regional group (-upstream) it is funded: its own part is
// the region's safe share (as learned from the global group, else the
// file's), the rest comes from the leader's upstream lease (Fund). In the global group it is
// the rule less every region's safe share as counted (safe.go: max(old,
// new) while a change is pending; never leased out), and a region's holder
// weighs by its region's weight.
//
// Operators' tunings (tune.go) replace the file's lease settings.
func (n *Node) quotaFor(set *rules.Set, ref *rationv1.QuotaRef, holder string) (string, lease.ConfigureQuota, float64, *lease.Bounds, string) {
	cfg := n.cfg
	fail := func(format string, args ...any) (string, lease.ConfigureQuota, float64, *lease.Bounds, string) {
		return "", lease.ConfigureQuota{}, 0, nil, ItemErrUnknownQuota + ": " + fmt.Sprintf(format, args...)
	}
	r, ok := set.Rule(ref.GetRule())
	if !ok {
		return fail("no rule %q in the coordinator's rules", ref.GetRule())
	}
	if !r.Mode.Leases() {
		return fail("rule %q is not leased (mode %v)", r.Name, r.Mode)
	}
	// A mode auto rule leases one promotion of a hot subject at a time,
	// named subject@epoch, whose pool starts empty: the subject's Redis
	// bucket may have spent the budget up to the promotion
	// (internal/bucket/hot.go).
	startEmpty := false
	if r.Mode == rules.ModeAuto {
		if _, _, ok := rules.SplitPromoted(ref.GetSubject()); !ok {
			return fail("rule %q is mode auto: a quota is one promotion of a subject, named subject@epoch, got %q", r.Name, ref.GetSubject())
		}
		startEmpty = true
	}
	id := QuotaID(r.Name, ref.GetSubject())
	c := lease.ConfigureQuota{
		Quota:        id,
		Burst:        r.Burst,
		Rate:         r.Rate,
		LeasePeriod:  r.Lease.Period.Microseconds(),
		MinSlice:     r.Lease.MinSlice,
		MaxSlice:     r.Lease.MaxSlice,
		SafetyMargin: cfg.SafetyMargin.Microseconds(),
		StartEmpty:   startEmpty,
	}
	if r.Lease.MaxSubjects > 0 {
		// Only then: a rule without it keeps the shape (and the encoding)
		// it had before max_subjects existed.
		c.Rule, c.MaxSubjects = r.Name, r.Lease.MaxSubjects
	}
	tuneQuota(&c, n.tuningOf(r.Name, cfg.Region))
	var weight float64
	var bounds *lease.Bounds
	switch {
	case r.Scope != region.ScopeGlobal:
	case cfg.Upstream != "":
		_, ok := r.Regions[region.ID(cfg.Region)]
		if !ok {
			return fail("rule %q is scope: global and has no share for this group's region %q", r.Name, cfg.Region)
		}
		safe := region.Safe(r.Burst, r.Rate, n.learnedSafe(r))
		c.Burst, c.Rate, c.Funded = safe.Burst, safe.Rate, true
		if c.Rate < lease.MinRate {
			c.Rate = 0
		}
	default:
		if id, isRegion := region.FromHolder(holder); isRegion {
			w, ok := r.Regions[id]
			if !ok {
				return fail("rule %q is scope: global and has no share for region %q", r.Name, id)
			}
			weight = w.Weight
			t := n.tuningOf(r.Name, string(id))
			if t.Weight != 0 {
				weight = t.Weight
			}
			bounds = regionBounds(t, c)
		}
		l := region.Leasable(r.Burst, r.Rate, n.countedRegions(r))
		if !(l.Burst > 0) {
			return fail("rule %q: the regions' safe shares take its whole burst; nothing is left to lease", r.Name)
		}
		c.Burst, c.Rate = l.Burst, l.Rate
		if c.Rate < lease.MinRate {
			c.Rate = 0
		}
	}
	// With lease.default_share f, the quota of rules.DefaultSubject has the
	// part f of the rule's shape and every other subject's quota the rest:
	// a subject's admissions through both stay within the whole, also
	// while a change of f moves size between them (split.go).
	wholeB, wholeR := c.Burst, c.Rate
	switch f := r.Lease.Split(ref.GetSubject()); {
	case f == 0 && ref.GetSubject() == rules.DefaultSubject:
		return fail("rule %q has no lease.default_share, so no default quota %q", r.Name, rules.DefaultSubject)
	case f == 0:
		return fail("rule %q has lease.default_share 1: every subject's budget is leased by default, none per subject", r.Name)
	case f < 1:
		c.Burst, c.Rate, c.MinSlice, c.MaxSlice = c.Burst*f, c.Rate*f, c.MinSlice*f, c.MaxSlice*f
		if c.Rate < lease.MinRate {
			c.Rate = 0
		}
		if bounds != nil {
			b := *bounds
			b.MinSlice, b.MaxSlice = b.MinSlice*f, b.MaxSlice*f
			bounds = &b
		}
	}
	if r.Wild() && !c.Funded {
		if msg := n.holdSplit(r, ref.GetSubject(), id, wholeB, wholeR, &c); msg != "" {
			return fail("%s", msg)
		}
	}
	if ref.GetSubject() == rules.DefaultSubject {
		// Not one of the rule's subjects: max_subjects never refuses it
		// (every subject's default part would go with it).
		c.Rule, c.MaxSubjects = "", 0
	}
	return id, c, weight, bounds, ""
}

// checkHolderRequest rejects a malformed Renew or Release as a whole
// before anything is proposed, naming every problem of the request itself
// (holder, seq, item count). Problems of single items are checkItem's: they
// fail that item alone.
func checkHolderRequest(holder string, seq uint64, items int, maxItems int) error {
	var ps []string
	bad := func(format string, args ...any) { ps = append(ps, fmt.Sprintf(format, args...)) }
	if msg := checkHolderName(holder); msg != "" {
		bad("%s", msg)
	} else if !utf8.ValidString(holder) {
		bad("holder is not valid UTF-8")
	}
	if seq == 0 {
		bad("seq must be > 0")
	}
	switch {
	case items == 0:
		bad("no items")
	case items > min(maxItems, lease.MaxItems):
		bad("%d items, at most %d (split the request)", items, min(maxItems, lease.MaxItems))
	case seq > math.MaxUint64-uint64(items):
		bad("seq %d leaves no room for %d items (a request uses seq .. seq+len(items)-1)", seq, items)
	}
	if len(ps) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrInvalidRequest, strings.Join(ps, "; "))
}

// checkSeqAhead refuses a holder command whose seq is more than
// lease.MaxSeqAhead past now in microseconds since the epoch. Holders
// start their numbers at most at their clock (lease.FirstSeq) and add one
// per item, far below it; a number further ahead, once applied, would
// make every later request of that holder stale (a lock-out bought with
// one call). Refused here, it changes nothing.
func checkSeqAhead(seq uint64, now time.Time) error {
	limit := uint64(max(0, now.UnixMicro())) + uint64(lease.MaxSeqAhead.Microseconds())
	if seq > limit {
		return fmt.Errorf("%w: seq %d is more than %v ahead of this coordinator's clock (%d µs since 1970): a holder numbers its requests from at most its clock, one per item",
			ErrSeqAhead, seq, lease.MaxSeqAhead, now.UnixMicro())
	}
	return nil
}

// itemChecker finds the problems of single items of one Renew or Release:
// the state machine would refuse them too, but after they had cost a Raft
// entry (and a NaN cannot even be encoded). An item with a problem is
// answered ItemErrInvalid and left out; the others go on.
type itemChecker struct {
	renew    bool
	leaseIDs map[uint64]bool
	quotas   map[string]bool
}

func newItemChecker(renew bool) *itemChecker {
	return &itemChecker{renew: renew, leaseIDs: map[uint64]bool{}, quotas: map[string]bool{}}
}

// check returns the item's Grant.error ("" when it is fine).
func (c *itemChecker) check(i int, it *rationv1.RenewItem) string {
	var ps []string
	bad := func(format string, args ...any) { ps = append(ps, fmt.Sprintf(format, args...)) }
	f := func(name string) string { return fmt.Sprintf("items[%d].%s", i, name) }
	if it == nil {
		return fmt.Sprintf("%s: items[%d] is null", ItemErrInvalid, i)
	}
	if !c.renew && it.LeaseId == 0 {
		bad("%s must be > 0", f("lease_id"))
	}
	if it.LeaseId != 0 {
		if c.leaseIDs[it.LeaseId] {
			bad("%s %d appears twice", f("lease_id"), it.LeaseId)
		}
		c.leaseIDs[it.LeaseId] = true
	}
	if c.renew {
		q := it.GetQuota()
		switch id := QuotaID(q.GetRule(), q.GetSubject()); {
		case q == nil || q.Rule == "":
			bad("%s is empty", f("quota.rule"))
		case len(id) > lease.MaxNameLen:
			bad("%s: rule and subject are %d bytes together, at most %d", f("quota"), len(id)-1, lease.MaxNameLen-1)
		case !utf8.ValidString(id):
			bad("%s is not valid UTF-8", f("quota"))
		case c.quotas[id]:
			bad("%s %q appears twice (a holder has one lease per quota)", f("quota"), id)
		default:
			c.quotas[id] = true
		}
	}
	for _, v := range []struct {
		name string
		v    float64
	}{{"unused", it.Unused}, {"demand", it.Demand}, {"confirmed_cap", it.ConfirmedCap}, {"confirmed_rate", it.ConfirmedRate}} {
		if !(v.v >= 0 && v.v <= lease.MaxValue) {
			bad("%s %v must be in [0, %g]", f(v.name), v.v, float64(lease.MaxValue))
		}
	}
	if len(ps) == 0 {
		return ""
	}
	return ItemErrInvalid + ": " + strings.Join(ps, "; ")
}

// servable answers early, without queueing, when this node cannot serve.
func (n *Node) servable() error {
	t := n.term.Load()
	switch {
	case t == nil:
		return ErrNotLeader
	case !t.ready.Load():
		return ErrNotReady
	}
	return nil
}

// rpcError maps an error to its gRPC status at the edge. UNAVAILABLE
// carries the leader's address in the "ration-leader" trailer: its lease
// address for a call on the lease port, its admin address for one on the
// admin listener (isAdminCall).
func (n *Node) rpcError(ctx context.Context, err error) error {
	st, leader := n.rpcStatus(ctx, err)
	if st.Code() == codes.Unavailable {
		_ = grpc.SetTrailer(ctx, metadata.Pairs(LeaderTrailer, leader))
	}
	return st.Err()
}

// rpcStatus is rpcError's status, and with UNAVAILABLE the address its
// trailer names (a RenewStream reply carries both itself).
func (n *Node) rpcStatus(ctx context.Context, err error) (*status.Status, string) {
	switch {
	case errors.Is(err, ErrInvalidRequest) || errors.Is(err, lease.ErrInvalid):
		return status.New(codes.InvalidArgument, err.Error()), ""
	case errors.Is(err, lease.ErrStale):
		return status.New(codes.FailedPrecondition, err.Error()), ""
	case errors.Is(err, ErrSeqAhead):
		return status.New(codes.OutOfRange, err.Error()), ""
	case errors.Is(err, ErrPermissionDenied):
		n.logger.Warn("call refused for the caller's identity", "err", err)
		return status.New(codes.PermissionDenied, err.Error()), ""
	case errors.Is(err, ErrTooManyIncarnations):
		n.logger.Warn("grant refused: too many incarnations of one agent identity hold leases", "err", err)
		return status.New(codes.ResourceExhausted, err.Error()), ""
	case errors.Is(err, ErrUnauthenticated):
		n.logger.Warn("admin call refused: no admin token, or another", "err", err)
		return status.New(codes.Unauthenticated, err.Error()), ""
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err), ""
	case errors.Is(err, ErrNotLeader) || errors.Is(err, ErrNotReady) || errors.Is(err, ErrStopped) ||
		isLeadershipErr(err) || errors.Is(err, raft.ErrEnqueueTimeout):
		id, addr, admin := n.leader()
		if id == n.cfg.ID {
			addr, admin = n.grpcAddr, n.adminAddr // leading but not ready yet: retry here
		}
		if isAdminCall(ctx) {
			addr = admin
		}
		return status.New(codes.Unavailable, err.Error()), addr
	}
	n.logger.Error("request failed", "err", err)
	return status.New(codes.Internal, err.Error()), ""
}
