package rlqs

// Usage reports checked before anything of them is applied.

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/rules"
)

// validate checks a whole report before anything is applied: bad input
// changes no state.
func (st *stream) validate(r *rlqsv3.RateLimitQuotaUsageReports) (string, []usage, error) {
	domain := r.GetDomain()
	switch {
	case st.domain == "" && domain == "":
		return "", nil, fmt.Errorf("the first report has no domain")
	case st.domain != "" && domain != "" && domain != st.domain:
		return "", nil, fmt.Errorf("domain %q differs from the stream's %q (open a new stream for another domain)", trunc(domain), trunc(st.domain))
	case len(domain) > rules.MaxKeyLen:
		return "", nil, fmt.Errorf("domain is %d bytes, at most %d", len(domain), rules.MaxKeyLen)
	case !utf8.ValidString(domain):
		// Reaches here through the agent's codec (agent.decodeRLQS),
		// as a bucket id's key or value does.
		return "", nil, fmt.Errorf("domain is not valid UTF-8")
	}
	if domain == "" {
		domain = st.domain
	}
	us := r.GetBucketQuotaUsages()
	if len(us) > st.s.o.MaxBuckets {
		return "", nil, fmt.Errorf("%d bucket usages in one report, at most %d", len(us), st.s.o.MaxBuckets)
	}
	out := make([]usage, 0, len(us))
	// first is where each bucket was named: Envoy names a bucket once a
	// report, and a bucket named twice would be counted, and answered,
	// twice.
	first := make(map[string]int, len(us))
	for i, u := range us {
		b := u.GetBucketId().GetBucket()
		if len(b) == 0 {
			return "", nil, fmt.Errorf("bucket_quota_usages[%d]: empty bucket_id", i)
		}
		key := bucketKey(b)
		if j, ok := first[key]; ok {
			return "", nil, fmt.Errorf("bucket_quota_usages[%d] and [%d]: the same bucket_id, a duplicate (a report names each bucket once)", j, i)
		}
		first[key] = i
		pairs := make(map[string]string, len(b)+1)
		for k, v := range b {
			pairs[k] = v
		}
		if v, ok := pairs[DomainKey]; ok && v != domain {
			return "", nil, fmt.Errorf("bucket_quota_usages[%d]: entry %q = %q conflicts with the domain %q (the domain is passed as %q)", i, DomainKey, trunc(v), trunc(domain), DomainKey)
		}
		pairs[DomainKey] = domain
		if len(pairs) > rules.MaxDescriptors {
			// The domain is one of the bucket's descriptors, as an RLS
			// request's is one of each descriptor's (agent.rlsRequests):
			// say so, rather than count one more than the client sent.
			own := len(pairs) - 1
			return "", nil, fmt.Errorf("bucket_quota_usages[%d]: bucket_id: %d entries besides the domain, at most %d (the stream's domain is one of a bucket's %d descriptors, entry %q, as in RLS)",
				i, own, rules.MaxDescriptors-1, rules.MaxDescriptors, DomainKey)
		}
		if err := rules.ValidateDescriptors(pairs); err != nil {
			return "", nil, fmt.Errorf("bucket_quota_usages[%d]: bucket_id: %w", i, err)
		}
		if te := u.GetTimeElapsed(); te != nil {
			if err := te.CheckValid(); err != nil || te.AsDuration() < 0 || te.AsDuration() > MaxElapsed {
				return "", nil, fmt.Errorf("bucket_quota_usages[%d]: time_elapsed %v must be in [0, %v]", i, te.AsDuration(), MaxElapsed)
			}
		}
		a, d := u.GetNumRequestsAllowed(), u.GetNumRequestsDenied()
		if a > MaxCount || d > MaxCount {
			return "", nil, fmt.Errorf("bucket_quota_usages[%d]: %d allowed, %d denied: at most %d each", i, a, d, uint64(MaxCount))
		}
		out = append(out, usage{key: key, id: u.GetBucketId(), pairs: pairs, allowed: float64(a), denied: float64(d)})
	}
	return domain, out, nil
}

// bucketKey is a canonical name of a bucket id: entries in key order,
// each length-prefixed (keys and values may hold any byte).
func bucketKey(b map[string]string) string {
	keys := make([]string, 0, len(b))
	for k := range b {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var sb strings.Builder
	for _, k := range keys {
		sb.WriteString(strconv.Itoa(len(k)))
		sb.WriteByte(':')
		sb.WriteString(k)
		sb.WriteString(strconv.Itoa(len(b[k])))
		sb.WriteByte(':')
		sb.WriteString(b[k])
	}
	return sb.String()
}

func trunc(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

func (st *stream) invalid(err error) error {
	st.s.m.refused.WithLabelValues("invalid").Inc()
	return status.Errorf(codes.InvalidArgument, "rlqs: %v", err)
}
