package agent

import (
	"context"
	"fmt"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ration-dev/ration/client/header"
	"github.com/ration-dev/ration/internal/rules"
)

// EnvoyDomainKey is the descriptor key under which the domain of an Envoy
// rate-limit request reaches the rules: a rule naming it (domain: edge)
// applies to that domain only, a rule not naming it to every domain.
const EnvoyDomainKey = "domain"

// MaxEnvoyDescriptors bounds the descriptors of one Envoy request.
const MaxEnvoyDescriptors = rules.MaxDescriptors

// envoyServer serves envoy.service.ratelimit.v3.RateLimitService on the
// agent's gRPC listener, so Envoy's HTTP rate-limit filter (and Istio,
// Contour, Gloo, Emissary...) use the agent unchanged.
//
// Mapping (docs/integrations/envoy.md says the same for operators):
//   - Each RateLimitDescriptor is one Ration request: its entries are the
//     descriptors map, plus EnvoyDomainKey set to the request's domain.
//     A key given twice with different values, or a domain entry that
//     differs from the domain, is an invalid request.
//   - Cost is the descriptor's hits_addend when set and positive, else the
//     request's hits_addend when positive, else 1.
//   - All descriptors are decided together in one store round trip. The
//     request is over limit if any descriptor is; then nothing is charged
//     anywhere (tokens taken for the others are refunded), as for a request
//     matching several rules.
//   - A descriptor denied only because the store is unreachable under a
//     fail_closed rule makes the call fail with UNAVAILABLE, unless another
//     descriptor is over limit (429 outranks 503). Envoy then applies its
//     filter's failure_mode_deny, exactly as when the agent is unreachable.
//   - Invalid input (no descriptors, bad keys or values, cost above the
//     burst of a rule in force (a shadow rule's only counts its denial),
//     limit overrides, negative hits) answers INVALID_ARGUMENT and touches
//     no bucket.
type envoyServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
	svc *Service
}

var _ rlsv3.RateLimitServiceServer = (*envoyServer)(nil)

// registerEnvoy adds the Envoy rate-limit service to the agent's gRPC server.
func registerEnvoy(g *grpc.Server, svc *Service) {
	// ShouldRateLimit's request is read through the agent's codec
	// (envoywire.go), so that bad bytes are answered as on Allow.
	g.RegisterService(envoyServiceDesc(), &envoyServer{svc: svc})
}

// ShouldRateLimit decides every descriptor of one Envoy request, for an
// in-process caller (the server reads and writes the wire itself:
// envoywire.go).
func (e *envoyServer) ShouldRateLimit(ctx context.Context, r *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	w := getRLSWire()
	defer w.release()
	rlsFromProto(r, w)
	a, err := e.decide(ctx, w)
	if err != nil {
		return nil, err
	}
	defer a.release()
	return toEnvoy(a.out)
}

// toEnvoy builds the answer: per-descriptor statuses, the overall code, and
// the RateLimit-Policy, RateLimit and (when over limit) Retry-After fields
// for Envoy to add to the client's response.
//
// Its messages are allocated together (envoyAnswer, envoyStatus) and the
// header values are sliced from one string: this answer is built once per
// call, and built message by message it cost more allocations than the
// decision it reports.
func toEnvoy(out []Response) (*rlsv3.RateLimitResponse, error) {
	overLimit, err := envoyVerdict(out)
	if err != nil {
		return nil, err
	}
	a := new(envoyAnswer)
	resp := &a.resp
	resp.OverallCode = rlsv3.RateLimitResponse_OK
	sts := a.one[:]
	resp.Statuses = a.status[:]
	if len(out) > 1 {
		sts = make([]envoyStatus, len(out))
		resp.Statuses = make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(out))
	}
	for i, o := range out {
		sts[i].fill(statusOf(o))
		resp.Statuses[i] = &sts[i].st
	}
	var retryAfter time.Duration
	if overLimit >= 0 {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		retryAfter = envoyRetryAfter(out)
	}
	resp.ResponseHeadersToAdd = a.headers(retryAfter, out)
	return resp, nil
}

// envoyAnswer is a response with room for one descriptor's answer (the
// usual request) and its header fields, in one allocation.
type envoyAnswer struct {
	resp      rlsv3.RateLimitResponse
	one       [1]envoyStatus
	status    [1]*rlsv3.RateLimitResponse_DescriptorStatus
	fields    [3]corev3.HeaderValue
	fieldPtrs [3]*corev3.HeaderValue
}

// envoyStatus is one descriptor's answer and the messages it points to.
type envoyStatus struct {
	st    rlsv3.RateLimitResponse_DescriptorStatus
	lim   rlsv3.RateLimitResponse_RateLimit
	reset durationpb.Duration
	mult  wrapperspb.UInt32Value
}

// fill sets es's messages to what st says.
func (es *envoyStatus) fill(st rlsStatus) {
	es.st.Code = st.code
	if !st.hasLimit {
		return
	}
	l := &es.lim
	l.Name, l.RequestsPerUnit = st.name, st.perUnit
	if st.window > 0 {
		l.Unit = rlsv3.RateLimitResponse_RateLimit_SECOND
		es.mult.Value = st.window
		l.UnitMultiplier = &es.mult
	}
	es.st.CurrentLimit = l
	if st.hasReset {
		es.st.LimitRemaining = st.remaining
		es.reset.Seconds, es.reset.Nanos = resetParts(st.reset)
		es.st.DurationUntilReset = &es.reset
	}
}

// headers are header.Fields for the deciding rules' quotas (envoyQuotas),
// as Envoy's header values, in the answer's own allocation.
func (a *envoyAnswer) headers(retryAfter time.Duration, out []Response) []*corev3.HeaderValue {
	var qbuf [4]header.Quota
	fs := header.Fields(retryAfter, envoyQuotas(out, qbuf[:0])...)
	for i, f := range fs {
		a.fields[i].Key, a.fields[i].Value = f.Name, f.Value
		a.fieldPtrs[i] = &a.fields[i]
	}
	return a.fieldPtrs[:len(fs)]
}

func quotaOf(o Response) header.Quota {
	return header.Quota{Policy: o.Rule, Limit: o.Limit, Rate: o.Rate, Remaining: o.Remaining, Reset: o.Reset, RetryAfter: o.RetryAfter}
}

// envoyQuotas lists one quota per deciding rule, in descriptor order, in
// qs's room: for a rule deciding several descriptors, a denying one over an
// admitting one, else the one with the least left. Decisions made without
// reading a bucket (reason unavailable: fail_open, fail_closed) report no
// quota.
func envoyQuotas(out []Response, qs []header.Quota) []header.Quota {
	var pickBuf [4]int
	pick := pickBuf[:0] // indexes into out
	for i, o := range out {
		if o.Rule == "" || o.Reason == ReasonUnavailable {
			continue
		}
		j := -1
		for k, p := range pick {
			if out[p].Rule == o.Rule {
				j = k
				break
			}
		}
		switch {
		case j < 0:
			pick = append(pick, i)
		case out[pick[j]].Allowed && !o.Allowed,
			out[pick[j]].Allowed == o.Allowed && o.Remaining < out[pick[j]].Remaining:
			pick[j] = i
		}
	}
	for _, p := range pick {
		qs = append(qs, quotaOf(out[p]))
	}
	return qs
}

// envoyRetryAfter is when every denying descriptor could admit again: the
// longest wait, or none when some denial no wait can lift (rate 0). A
// descriptor denied because the store is unreachable counts as the check
// endpoint's 503 does: one second.
func envoyRetryAfter(out []Response) time.Duration {
	var d time.Duration
	for _, o := range out {
		if o.Allowed {
			continue
		}
		if CheckStatus(o) == 503 {
			d = max(d, header.UnavailableRetryAfter)
			continue
		}
		if o.RetryAfter <= 0 {
			return 0
		}
		d = max(d, o.RetryAfter)
	}
	return d
}

// decideAll decides requests that stand or fall together (the descriptors
// of one Envoy request): one store round trip for all their charges; if any
// is denied, every token any of them took is refunded, so a rejected request
// costs nothing. An invalid request fails the whole call before any bucket
// is touched. out must be as long as reqs.
//
// It is decideBatch's pipeline (joint), watched as every decision is.
// Envoy requests carry no request id, so the agent's record of request ids
// is not consulted. Every decision is logged to -record like Allow's.
func (s *Service) decideAll(ctx context.Context, reqs []Request, out []Response) error {
	var errBuf [1]error
	errs := errBuf[:]
	if len(reqs) > 1 {
		errs = make([]error, len(reqs))
	}
	s.decideWatched(ctx, reqs, out, errs, true)
	for i, err := range errs {
		if err != nil {
			return fmt.Errorf("descriptor %d: %w", i, err)
		}
	}
	return nil
}
