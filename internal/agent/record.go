package agent

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ration-dev/ration/internal/admission"
)

// recorder writes every decision to the admission log (-record FILE) in the
// format of internal/admission (AppendLine), for the overshoot checker
// (cmd/ration-check) and the chaos suite. It is off unless -record is set.
//
// Cost: one clock read at the start of a batch and one after it, the lines
// formatted into a pooled buffer, and ONE write(2) per batch under a mutex.
// Nothing is held in user space between batches, so a SIGKILLed agent loses
// no decision it answered: each batch is in the page cache before its
// answers leave DecideBatch.
//
// Timestamps are CLOCK_MONOTONIC nanoseconds (monoNow), which every process
// of one host shares, so the logs of several agents merge into one history.
type recorder struct {
	agent string
	mu    sync.Mutex
	f     *os.File
	bufs  sync.Pool
	fails atomic.Int64 // writes that failed (counted, logged at close)
}

func openRecorder(path, agent string) (*recorder, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("agent: -record: %w", err)
	}
	r := &recorder{agent: agent, f: f}
	r.bufs.New = func() any { b := make([]byte, 0, 4096); return &b }
	return r, nil
}

// batch logs one batch's decisions: one line per step (a request matching
// two rules charges two quotas), each with its request's final verdict,
// since a step of a denied request is refunded. out[i] must be the final
// verdict of request i: whether its charges stand.
func (r *recorder) batch(start int64, steps []step, out []Response) {
	if len(steps) == 0 {
		return
	}
	end := monoNow()
	bp := r.bufs.Get().(*[]byte)
	buf := (*bp)[:0]
	for i := range steps {
		st := &steps[i]
		if st.skip {
			continue // decided again later, and logged then
		}
		allowed := out[st.item].Allowed
		if st.rule.Shadow && !st.allowed && !st.replayed {
			// A shadow rule's denial charged nothing, though the request
			// went on: the checker must not count it against the quota.
			allowed = false
		}
		rec := admission.Record{
			At:        time.Duration(end),
			Latency:   time.Duration(end - start),
			Agent:     r.agent,
			Quota:     recordQuota(st),
			Cost:      st.req.Cost,
			Allowed:   allowed,
			Path:      st.path.String(),
			Reason:    st.reason.String(),
			RequestID: st.rid,
			// The shape this agent enforces: for a scope: global, mode:
			// redis rule, its region's share, not the rule's whole shape
			// (a checker given the whole would judge the region too
			// loosely); never the emergency bucket's.
			Burst: st.limit.Burst,
			Rate:  st.limit.Rate,
		}
		if st.replayed {
			// Answered from the agent's record of request ids: charged
			// nothing. The id is the first attempt's, which the checker
			// counts once.
			rec.Path, rec.Reason = replayPath, out[st.item].Reason.String()
		}
		buf = admission.AppendLine(buf, &rec)
	}
	r.mu.Lock()
	_, err := r.f.Write(buf)
	r.mu.Unlock()
	if err != nil {
		r.fails.Add(1)
	}
	*bp = buf
	r.bufs.Put(bp)
}

// recordQuota is the quota a step charges: the rule's bucket for its subject
// (an emergency step charges a local bucket, but records the quota it
// stands in for).
func recordQuota(st *step) string { return st.rule.Name + "|" + st.subject }

func (r *recorder) close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	err := r.f.Close()
	if n := r.fails.Load(); n > 0 && err == nil {
		err = fmt.Errorf("agent: -record: %d batch writes failed", n)
	}
	return err
}

// StartRecording makes the service log every decision to path (appending).
// Call it before the service answers its first request.
func (s *Service) StartRecording(path, agentID string) (stop func() error, err error) {
	r, err := openRecorder(path, agentID)
	if err != nil {
		return nil, err
	}
	s.rec = r
	return r.close, nil
}
