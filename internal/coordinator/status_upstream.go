package coordinator

import (
	"sync"
	"time"

	"github.com/ration-dev/ration/internal/lease"
)

// The status page of a regional group shows its link to the global group:
// what the upstream leases fund, and how this node's renewals of them went.
// Only the leader renews upstream; a follower's page says so.

// upstreamHealth is how this node's upstream renewals went.
type upstreamHealth struct {
	mu                 sync.Mutex
	ok, failed         int64
	lastOK, lastFailed time.Time
	lastErr            string
}

func (u *upstreamHealth) record(at time.Time, err error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if err != nil {
		u.failed++
		u.lastFailed, u.lastErr = at, err.Error()
		return
	}
	u.ok++
	u.lastOK = at
}

// statusUpstream is the regional group's upstream view.
type statusUpstream struct {
	Address string `json:"address"` // -upstream
	// Renewing is true on the leader, which alone renews upstream.
	Renewing bool `json:"renewing"`
	// Healthy: the latest renewal succeeded.
	Healthy bool `json:"healthy"`
	// Renewals and Failures count this node's renewals since it started.
	Renewals int64 `json:"renewals_ok"`
	Failures int64 `json:"renewals_failed"`
	// LastOK and LastFailure are the latest of each (absent: none), Ago
	// the seconds since; LastError the latest failure's error.
	LastOK         *time.Time `json:"last_ok,omitempty"`
	LastOKAgo      float64    `json:"last_ok_ago_s,omitempty"`
	LastFailure    *time.Time `json:"last_failure,omitempty"`
	LastFailureAgo float64    `json:"last_failure_ago_s,omitempty"`
	LastError      string     `json:"last_error,omitempty"`
	// FundedQuotas counts the quotas the upstream leases fund (of those
	// the view scanned), FundedRate and FundedBurst what they add to them.
	FundedQuotas int     `json:"funded_quotas"`
	FundedRate   float64 `json:"funded_rate"`
	FundedBurst  float64 `json:"funded_burst"`
}

// upstreamView is the view's upstream part; nil outside a regional group.
func (n *Node) upstreamView(now time.Time, leader bool) *statusUpstream {
	if n.cfg.Upstream == "" {
		return nil
	}
	u := &n.upHealth
	u.mu.Lock()
	defer u.mu.Unlock()
	v := &statusUpstream{Address: n.cfg.Upstream, Renewing: leader, Renewals: u.ok, Failures: u.failed}
	if !u.lastOK.IsZero() {
		at := u.lastOK.UTC()
		v.LastOK, v.LastOKAgo = &at, max(now.Sub(at).Seconds(), 0)
	}
	if !u.lastFailed.IsZero() {
		at := u.lastFailed.UTC()
		v.LastFailure, v.LastFailureAgo, v.LastError = &at, max(now.Sub(at).Seconds(), 0), u.lastErr
	}
	v.Healthy = !u.lastOK.IsZero() && u.lastOK.After(u.lastFailed)
	return v
}

// addFunding counts a quota's upstream funding into v.
func (v *statusUpstream) addFunding(q lease.QuotaInfo) {
	if v == nil || !q.Funded {
		return
	}
	v.FundedQuotas++
	v.FundedRate += q.Fund.Rate
	v.FundedBurst += q.Fund.Burst
}
