package rlqs

import (
	"context"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
)

// Sending lent assignments again before they lapse at Envoy, unasked.

// renewLead is how long before a lent assignment must reach Envoy to be
// carried on (its TTL there not yet over: send + TTL - Delta) the stream
// sends it again: the time to plan and send it.
const renewLead = 50 * time.Millisecond

// renewAt is when b's lent assignment is sent again unasked (renew): a
// TTL is bounded by its lease's validity, often a second or two, shorter
// than Envoy's report interval plus Delta, and an assignment that lapses
// at Envoy leaves its bucket to its no-assignment behaviour (denied) until
// the next report's answer, which then starts a new bucket charged its
// whole max_tokens. 0: none, because b has no lent assignment standing or
// its last report counted no request, or none came for two report
// intervals (an idle bucket is left to lapse: its share of the lease's
// rate goes back).
//
// An assignment's TTL, a whole second at least, must end before its
// lease's validity, which the holder extends by steps as it renews the
// lease: at the last moment the validity may not leave a second. So the
// stream also looks every renewCheck before that (renew), and sends it
// early when the validity leaves a second now but would not then.
//
// A bucket denied only until its lease can fund it (its first grant on
// the way, a validity too short for a second's TTL, or the first in line
// for a turn) is asked about again at retry, not left denied until its
// Envoy's next report.
func (st *stream) renewAt(b *bucketState) int64 {
	due := st.renewBy(b)
	if due == 0 {
		if b.retry != 0 && st.reporting(b) {
			return b.retry
		}
		return 0
	}
	return min(due, max(b.check, b.lastSent+renewCheck.Microseconds()))
}

// reporting says whether b's Envoy still reports requests for it: its
// last report counted some, and came within two report intervals.
func (st *stream) reporting(b *bucketState) bool {
	return !b.abandoned && b.busy == b.reported &&
		st.s.now()-b.reported <= 2*max(b.gap, time.Second.Microseconds())+st.s.o.Delta.Microseconds()
}

// renewBy is the last moment b's lent assignment can be sent again and
// still reach Envoy before it expires there; 0: none to send (renewAt).
func (st *stream) renewBy(b *bucketState) int64 {
	if b.until == 0 || b.lastSent == 0 || !b.lent || !st.reporting(b) {
		return 0 // none, or its Envoy stopped reporting: left to lapse
	}
	return b.lastSent + b.last.ttl*1e6 - st.s.o.Delta.Microseconds() - renewLead.Microseconds()
}

// renewCheck is how often a lent assignment's lease validity is looked
// at before its renewal is due (renewAt).
const renewCheck = 100 * time.Millisecond

// schedule sets timer for the earliest renewAt of the stream's buckets.
func (st *stream) schedule(timer *time.Timer) {
	var next int64
	for _, b := range st.buckets {
		if at := st.renewAt(b); at != 0 && (next == 0 || at < next) {
			next = at
		}
	}
	if next == 0 {
		timer.Reset(time.Hour)
		return
	}
	timer.Reset(max(time.Millisecond, time.Duration(next-st.s.now())*time.Microsecond))
}

// renew sends again the lent assignments due (renewAt), as the answer to
// a report would: unchanged, one is carried on by Envoy and lends no
// tokens (tab.carries).
func (st *stream) renew(ctx context.Context) error {
	now := st.s.now()
	resp := &rlqsv3.RateLimitQuotaResponse{}
	var acted []*bucketState
	ttl := (time.Second + st.s.o.Delta + renewLead).Microseconds()
	for _, b := range st.buckets {
		if at := st.renewAt(b); at == 0 || at > now {
			continue
		}
		lend, take := st.match(b)
		if len(take) > 0 || len(lend) != 1 {
			b.lent = false // the rules changed: the next report decides
			continue
		}
		v := st.s.o.Funds.ValidUntil(lend[0].Rule, lend[0].Subject)
		switch due := st.renewBy(b); {
		case due == 0:
			// A retry (renewAt): only once the lease can fund a TTL.
			if v != 0 && v-now < ttl {
				b.retry = now + renewCheck.Microseconds()
				continue
			}
		case now < due:
			// A look before the due time: send now only if the lease's
			// validity leaves a second's TTL now, but would not at the
			// next look, nor at due.
			if v-now < ttl || v-(now+renewCheck.Microseconds()) >= ttl || v-due >= ttl {
				b.check = now + renewCheck.Microseconds()
				continue
			}
		}
		// No report came since the last action: its demand is still the
		// one that action was sized for, and what is asked from now on
		// counts from then.
		a, _ := st.assign(ctx, b, b.sized, lend, take)
		resp.BucketAction = append(resp.BucketAction, a)
		acted = append(acted, b)
	}
	return st.send(resp, acted)
}
