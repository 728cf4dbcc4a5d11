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
	for len(at) > 0 {
		part := at[:min(len(at), size)]
		at = at[len(part):]
		for j, i := range part {
			reqs[j] = steps[i].req
		}
		s.storeCall(caller, steps, reqs[:len(part)], part, outs)
	}
}

// storeCall decides steps[at[j]] by reqs[j] in one store call, with a
// deadline of its own.
func (s *Service) storeCall(caller context.Context, steps []step, reqs []bucket.Request, at []int, outs []bucket.Outcome) {
	switch {
	case caller.Err() != nil:
		// The caller is gone (or its deadline passed) before this call:
		// nothing to ask of the store, and nothing said of it.
		s.metrics.storeErrors.WithLabelValues("caller_gone").Add(float64(len(at)))
		for _, i := range at {
			steps[i].path = pathFallback // pathGone in charge's last loop
		}
		return
	case !s.breaker.Allow():
		// Opened since the batch began (by another caller's failures, or
		// this batch's previous call): as chargeStore does.
		s.metrics.breakerShortCircuits.Add(float64(len(at)))
		for _, i := range at {
			steps[i].path = pathFallback
		}
		return
	}
	ctx, cancel := s.bound(caller)
	outs = outs[:len(reqs)]
	s.store.TakeBatch(ctx, reqs, outs)
	cancel()
	now := time.Now()
	health := storeSilent
	var failure error // the first failure of the call, the episode's cause
	for j, i := range at {
		switch s.adoptStore(caller, &steps[i], outs[j].Result, outs[j].Err) {
		case storeFailed:
			health = storeFailed
			if failure == nil {
				failure = outs[j].Err
			}
		case storeAnswered:
			if health == storeSilent {
				health = storeAnswered
			}
		}
	}
	switch health {
	case storeFailed:
		s.storeFailure(now, failure)
	case storeAnswered:
		s.storeSuccess(now)
	}
}
