package admission

import "time"

// Refusals is the second judge's verdict on one quota: the refusals of
// requests its budget still held.
//
// A refusal of cost c, known at At and decided somewhere in
// [At - Latency, At], is false when an exact token bucket of the quota's
// (B, r), fed the quota's admitted history, would have admitted it:
//
//	level + c <= B
//
// where level is the leaky-bucket level of every admission known by At
// (a repeated request id once), and of every later-known one that may
// have been decided before At (its own At - Latency <= At), drained only
// until At - Latency. So the judge never calls a refusal false that a
// different order of concurrent decisions, or the refusal's own latency,
// could explain; with exact stamps (a Recorder) it is exact. Every kind
// of refusal counts: over the limit, and a failure policy's denial on a
// system whose dependencies answered.
type Refusals struct {
	Refused   int     // refused records of the quota
	False     int     // of them, false refusals
	FalseCost float64 // their cost
	// At lists when each false refusal was known, so that a test can
	// hold them to its allowances (say, a window after a fault).
	At []time.Duration
}

// lookAhead bounds how many later admissions a refusal's level counts
// for concurrency; past it the refusal is not judged false (lenient).
const lookAhead = 256

// refusals judges the refusals of quota in recs (sorted by time) against
// (burst, rate). adm are the quota's counted admissions, in order.
func refusals(recs []Record, adm []Record, quota string, burst, rate float64) Refusals {
	return refusalsBy(recs, adm, quota, rate, func(Record) float64 { return burst })
}

// SpanRefusals is the second judge on spans (a client's [send, answer]):
// adm are the admissions of one quota, refused its refusals. A rule whose
// shape changes over a run is judged leniently: its level drains at rate,
// the least rate the rule had (a slower drain leaves the level higher),
// and each refusal is held to burstOf(its span), the least burst that may
// have been in force anywhere in it.
func SpanRefusals(adm, refused []Span, rate float64, burstOf func(Span) float64) Refusals {
	toRec := func(s Span, allowed bool) Record {
		return Record{At: s.To, Latency: s.To - s.From, Cost: s.Cost, Allowed: allowed}
	}
	var recs, admRecs []Record
	for _, s := range adm {
		admRecs = append(admRecs, toRec(s, true))
	}
	for _, s := range refused {
		recs = append(recs, toRec(s, false))
	}
	Sort(admRecs)
	Sort(recs)
	return refusalsBy(recs, admRecs, "", rate, func(r Record) float64 {
		return burstOf(Span{From: r.At - r.Latency, To: r.At, Cost: r.Cost})
	})
}

// refusalsBy is refusals with each refusal's burst given by burstOf.
func refusalsBy(recs []Record, adm []Record, quota string, rate float64, burstOf func(Record) float64) Refusals {
	var out Refusals
	var level float64
	var last time.Duration
	next := 0 // adm[:next] are in level, drained to last
	for _, r := range recs {
		if r.Quota != quota || r.Allowed {
			continue
		}
		out.Refused++
		at := r.At - r.Latency
		for next < len(adm) && adm[next].At <= r.At {
			a := adm[next]
			level = max(0, level-rate*(a.At-last).Seconds()) + a.Cost
			last = a.At
			next++
		}
		l := level
		if at > last {
			l = max(0, l-rate*(at-last).Seconds())
		}
		judged := true
		for i := next; i < len(adm) && adm[i].At-adm[i].Latency <= r.At; i++ {
			if i-next >= lookAhead {
				judged = false
				break
			}
			l += adm[i].Cost // may have been decided first: counted undrained
		}
		if judged && l+r.Cost <= burstOf(r)+Tolerance {
			out.False++
			out.FalseCost += r.Cost
			out.At = append(out.At, r.At)
		}
	}
	return out
}

// Deny records a refusal now.
func (r *Recorder) Deny(agent, quota string, cost float64) {
	at := time.Since(r.origin)
	r.mu.Lock()
	r.recs = append(r.recs, Record{At: at, Quota: quota, Cost: cost, Agent: agent})
	r.mu.Unlock()
}
