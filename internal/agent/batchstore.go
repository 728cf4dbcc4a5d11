package agent

import (
	"context"
	"time"

	"github.com/ration-dev/ration/internal/bucket"
)

// storeChunk is the most store charges one store call of a batch carries.
// Each call gets the decision timeout of its own (bound), so a batch of any
// allowed size is decided in calls that each take about what a batch of
// storeChunk takes: some milliseconds of the store's time (Redis decides
// a charge in 10-15µs), well within the 50ms default timeout, where a
// whole AllowBatch of MaxBatch items sent at once took 140-170ms, timed
// out, and failed its unanswered items to their rules' policies.
//
// Calls are made one after another: the store is a shared resource, and a
// batch that held it for its whole size at once would delay every other
// caller's decisions behind it. Between two calls of a batch, theirs go
// through.
const storeChunk = 1024

// chargeStoreBatch decides the n pathRedis steps of a batch in the store, in
// calls of at most storeChunk charges, in the steps' order (charges of one
// key are decided in order).
//
// Each call counts once for the circuit breaker and the outage episode, as
// one unary decision's call does: a call that failed (timed out, or the
// store refused it) is one failure, not one per charge it carried. Counted
// per charge, one slow call of a large batch was thousands of failures,
// opened the breaker at once, and sent every other caller's decisions to
// their failure policy for a probe interval.
func (s *Service) chargeStoreBatch(caller context.Context, steps []step, n int) {
	at := make([]int, 0, n)
	for i := range steps {
		if steps[i].path == pathRedis {
			at = append(at, i)
		}
	}
	s.storeSteps(caller, steps, at)
}

// storeSteps decides steps[at[j]] in the store, in at's order, in calls of
// at most storeChunk.
func (s *Service) storeSteps(caller context.Context, steps []step, at []int) {
	size := min(len(at), storeChunk)
	reqs := make([]bucket.Request, size)
	outs := make([]bucket.Outcome, size)
	part := make([]int, 0, size) // storeCall's to change: at is the caller's
	for len(at) > 0 {
		part = append(part[:0], at[:min(len(at), size)]...)
		at = at[len(part):]
		s.storeCall(caller, steps, reqs, part, outs)
	}
}

// storeCall decides steps[at[j]] in one store call, with a deadline of its
// own; at, reqs and outs are its scratch (reqs and outs at least as long
// as at). The call counts once for each node it went to (a
// Cluster client splits it per node): a node that failed it is one
// failure of that node, and the other nodes' answers close their own
// counts, so a dead master never opens a healthy one's breaker.
func (s *Service) storeCall(caller context.Context, steps []step, reqs []bucket.Request, at []int, outs []bucket.Outcome) {
	if caller.Err() != nil {
		// The caller is gone (or its deadline passed) before this call:
		// nothing to ask of the store, and nothing said of it.
		s.metrics.storeErrors.WithLabelValues("caller_gone").Add(float64(len(at)))
		for _, i := range at {
			steps[i].path = pathFallback // pathGone in charge's last loop
		}
		return
	}
	// Steps whose node's breaker opened since the batch began (by another
	// caller's failures, or this batch's previous call) fall to their
	// policy, as in route.
	k := 0
	for _, i := range at {
		if st := &steps[i]; !st.node.br.Allow() {
			s.metrics.breakerShortCircuits.Inc()
			st.path = pathFallback
			continue
		}
		reqs[k], at[k] = steps[i].req, i
		k++
	}
	if k == 0 {
		return
	}
	reqs, at = reqs[:k], at[:k]
	ctx, cancel := s.bound(caller)
	outs = outs[:len(reqs)]
	sent := sinceStart()
	s.store.TakeBatch(ctx, reqs, outs)
	cancel()
	now := time.Now()
	var hs [4]nodeHealth // a call's nodes: as many as a Cluster's masters
	health := hs[:0]
	for j, i := range at {
		st := &steps[i]
		h := st.adoptHealth(&health)
		switch s.adoptStore(caller, st, outs[j].Result, outs[j].Err, sent) {
		case storeFailed:
			health[h].health = storeFailed
			if health[h].failure == nil {
				health[h].failure = outs[j].Err
			}
		case storeAnswered:
			if health[h].health == storeSilent {
				health[h].health = storeAnswered
			}
		}
	}
	for _, h := range health {
		switch h.health {
		case storeFailed:
			s.nodes.failure(h.node, now, h.failure)
		case storeAnswered:
			s.nodes.success(h.node, now)
		}
	}
}

// nodeHealth is what one store call says of one node.
type nodeHealth struct {
	node    *storeNode
	health  storeHealth
	failure error // the node's first failure in the call, its episode's cause
}

// adoptHealth is the index of st's node in *hs, added if need be.
func (st *step) adoptHealth(hs *[]nodeHealth) int {
	for k := range *hs {
		if (*hs)[k].node == st.node {
			return k
		}
	}
	*hs = append(*hs, nodeHealth{node: st.node})
	return len(*hs) - 1
}
