package coordinator

import (
	"errors"

	"github.com/ration-dev/ration/internal/lease"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// The pure part of a Renew and a Release: a request mapped to state
// machine commands, and those commands' results mapped to the answer.
// The leasesServer runs it around a Raft proposal; internal/sim runs the
// same code around its model of one, so the simulator checks this code
// rather than a copy of it.

// QuotaResolver resolves a quota reference of holder: the quota id, its
// shape, the holder's weight (0: the default) and its bounds, or the
// item's error text. The coordinator's is Node.quotaFor over its rules.
type QuotaResolver func(ref *rationv1.QuotaRef, holder string) (id string, cfg lease.ConfigureQuota, weight float64, bounds *lease.Bounds, msg string)

// RenewPlan is one RenewRequest mapped to commands, all for one entry: a
// Grant per item with lease_id 0 (in item order), numbered seq, seq+1,
// ..., then one Renew for the other items, numbered after all the grant
// items. Items refused (malformed, or by the rules) keep their numbers, so
// a retry with the same seq and items maps to the same commands, across a
// rules reload too; the state machine replays the last one's answer.
type RenewPlan struct {
	// Ops are the commands, in order; empty when no item is left, and
	// then Answer needs no results.
	Ops []lease.Command
	// Configs are the shapes of the quotas the ops touch, from the
	// rules.
	Configs []lease.ConfigureQuota
	// Touched are the quota ids proposed, for the nudge planner.
	Touched []string

	seq        uint64
	grants     []*rationv1.Grant
	renew      lease.Renew
	grantItems []int // request item index of each Grant command
	renewItems []int // request item index of each renew item
}

// PlanRenew maps req to its commands, resolving each item's quota with
// quota. req's holder, seq and item count must have passed
// checkHolderRequest.
func PlanRenew(req *rationv1.RenewRequest, quota QuotaResolver) *RenewPlan {
	p := &RenewPlan{seq: req.Seq, grants: make([]*rationv1.Grant, len(req.Items))}
	items := newItemChecker(true)
	// Numbers follow from the request alone (not from which items the
	// rules accept): the n-th item with lease_id 0 is seq+n, the renewal
	// comes after all of them.
	seq := req.Seq
	for i, it := range req.Items {
		p.grants[i] = &rationv1.Grant{Quota: it.GetQuota(), LeaseId: it.GetLeaseId()}
		grantSeq := seq
		if it.GetLeaseId() == 0 {
			seq++
		}
		if msg := items.check(i, it); msg != "" {
			p.grants[i].Error = msg
			continue
		}
		qid, cfg, weight, bounds, msg := quota(it.Quota, req.Holder)
		if msg != "" {
			p.grants[i].Error = msg
			continue
		}
		p.Touched = append(p.Touched, qid)
		p.Configs = append(p.Configs, cfg)
		if it.LeaseId == 0 {
			p.Ops = append(p.Ops, lease.Grant{
				Holder: req.Holder, Seq: grantSeq, Quota: qid, Demand: it.Demand, Weight: weight, Bounds: bounds,
			})
			p.grantItems = append(p.grantItems, i)
			continue
		}
		p.renew.Items = append(p.renew.Items, lease.RenewItem{
			LeaseID: it.LeaseId, Quota: qid, Unused: it.Unused, Demand: it.Demand, Weight: weight, Bounds: bounds,
			ConfirmedCap: it.ConfirmedCap, ConfirmedRate: it.ConfirmedRate,
		})
		p.renewItems = append(p.renewItems, i)
	}
	if len(p.renew.Items) > 0 {
		p.renew.Holder, p.renew.Seq = req.Holder, seq
		p.Ops = append(p.Ops, p.renew)
	}
	return p
}

// HasGrants reports whether the plan asks for a new lease.
func (p *RenewPlan) HasGrants() bool { return len(p.grantItems) > 0 }

// Commands are Ops with each Grant given its quota's shape (Configs), as
// the entry carries them: a Grant creates its quota if the state machine
// has removed it (idle) since the shape was configured.
func (p *RenewPlan) Commands() []lease.Command {
	out := make([]lease.Command, len(p.Ops))
	for i, c := range p.Ops {
		out[i] = withConfig(c, p.Configs)
	}
	return out
}

// Answer builds the answer from the results of Ops (aligned with them; nil
// when Ops is empty). replayed: the request was applied before (a retry),
// answered from the state machine's record. A non-nil error concerns the
// whole request: ErrStale (a stale or reused seq), or an error of the
// state machine that no item error names.
func (p *RenewPlan) Answer(results []OpResult) (resp *rationv1.RenewResponse, replayed bool, err error) {
	grants := p.grants
	if len(p.Ops) == 0 {
		return &rationv1.RenewResponse{Grants: grants}, false, nil
	}
	last := results[len(results)-1]
	// The last command answered from the record: the request was applied
	// before (this is a retry), and earlier commands come back ErrStale.
	replayed = last.Result.Replayed
	if errors.Is(last.Err, lease.ErrStale) {
		return nil, replayed, last.Err
	}
	for j, i := range p.grantItems {
		r := results[j]
		switch {
		case r.Err == nil:
			if r.Result.Lease == nil || r.Result.Lease.Quota != p.Ops[j].(lease.Grant).Quota {
				return nil, replayed, errSeqReused(p.seq)
			}
			FillGrant(grants[i], r.Result.Lease)
		case errors.Is(r.Err, lease.ErrStale) && replayed:
			grants[i].Error = ItemErrRetryGrant
		default:
			if msg := ItemError(r.Err); msg != "" {
				grants[i].Error = msg
			} else {
				return nil, replayed, r.Err
			}
		}
	}
	if len(p.renewItems) > 0 {
		r := results[len(results)-1]
		if r.Err != nil {
			return nil, replayed, r.Err
		}
		// A replayed answer is the answer to whatever was sent with that
		// seq: if the holder reused it for other items, say so rather than
		// hand out another request's answers.
		if len(r.Result.Items) != len(p.renew.Items) {
			return nil, replayed, errSeqReused(p.renew.Seq)
		}
		for j, i := range p.renewItems {
			ir := r.Result.Items[j]
			if ir.LeaseID != p.renew.Items[j].LeaseID || ir.Quota != p.renew.Items[j].Quota {
				return nil, replayed, errSeqReused(p.renew.Seq)
			}
			if ir.Err != nil {
				grants[i].Error = ItemError(ir.Err)
				continue
			}
			FillGrant(grants[i], ir.Lease)
		}
	}
	return &rationv1.RenewResponse{Grants: grants}, replayed, nil
}

// ReleasePlan is one ReleaseRequest mapped to commands: a Release per
// item, numbered seq+i. A refused item keeps its number: a retry maps to
// the same commands.
type ReleasePlan struct {
	// Ops are the commands, in order; empty when no item is left.
	Ops    []lease.Command
	holder string
	resp   *rationv1.ReleaseResponse
}

// PlanRelease maps req to its commands. req's holder, seq and item count
// must have passed checkHolderRequest.
func PlanRelease(req *rationv1.ReleaseRequest) *ReleasePlan {
	p := &ReleasePlan{holder: req.Holder, resp: &rationv1.ReleaseResponse{Errors: make([]string, len(req.Items))}}
	items := newItemChecker(false)
	for i, it := range req.Items {
		if msg := items.check(i, it); msg != "" {
			p.resp.Errors[i] = msg
			continue
		}
		p.Ops = append(p.Ops, lease.Release{
			Holder: req.Holder, Seq: req.Seq + uint64(i), LeaseID: it.LeaseId, Unused: it.Unused,
		})
	}
	return p
}

// Touched are the quotas of the leases the plan releases that s has live
// for the holder: what the releases free may be wanted at once by the
// quotas' other holders, so the nudge planner looks at them once applied.
func (p *ReleasePlan) Touched(s *lease.State) []string {
	var out []string
	for _, c := range p.Ops {
		if l, ok := s.LeaseByID(c.(lease.Release).LeaseID); ok && l.Holder == p.holder {
			out = append(out, l.Quota)
		}
	}
	return out
}

// Answer builds the answer from the results of Ops (nil when Ops is
// empty). A release of a lease that is no longer live credits nothing and
// is not an error for the holder: it stopped spending either way. Only a
// stale request (older than the holder's last) is an error, ErrStale.
func (p *ReleasePlan) Answer(results []OpResult) (resp *rationv1.ReleaseResponse, replayed bool, err error) {
	if len(p.Ops) == 0 {
		return p.resp, false, nil
	}
	last := results[len(results)-1]
	if errors.Is(last.Err, lease.ErrStale) {
		return nil, last.Result.Replayed, last.Err
	}
	return p.resp, last.Result.Replayed, nil
}
