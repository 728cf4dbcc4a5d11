package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/client"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// errUnreachable marks a target that did not answer the preflight check.
var errUnreachable = errors.New("unreachable")

// kind is what became of one decision.
type kind uint8

const (
	kindAllowed kind = iota
	kindDenied
	kindError
)

type outcomeKey struct {
	kind   kind
	reason string
}

// tally counts one call's outcomes by kind and reason.
type tally map[outcomeKey]int64

func (t tally) add(k kind, reason string, n int64) { t[outcomeKey{k, reason}] += n }

// reasonNames maps the proto enum to the agent's own words (docs/api.md):
// REASON_OVER_LIMIT -> over_limit.
var reasonNames = func() map[rationv1.Reason]string {
	m := make(map[rationv1.Reason]string, len(rationv1.Reason_name))
	for v, name := range rationv1.Reason_name {
		m[rationv1.Reason(v)] = strings.ToLower(strings.TrimPrefix(name, "REASON_"))
	}
	return m
}()

func reasonName(r rationv1.Reason) string {
	if s, ok := reasonNames[r]; ok {
		return s
	}
	return "reason_" + strconv.Itoa(int(r))
}

// addAnswer counts one AllowResponse. A REASON_INVALID item is an error:
// the agent could not decide it.
func (t tally) addAnswer(r *rationv1.AllowResponse) {
	switch {
	case r.GetReason() == rationv1.Reason_REASON_INVALID:
		t.add(kindError, "invalid", 1)
	case r.GetAllowed():
		t.add(kindAllowed, reasonName(r.GetReason()), 1)
	default:
		t.add(kindDenied, reasonName(r.GetReason()), 1)
	}
}

// grpcReason names a failed call by its status code: "grpc:Unavailable".
func grpcReason(err error) string { return "grpc:" + status.Code(err).String() }

// caller makes one worker's calls. Not safe for concurrent use.
type caller interface {
	// call sends one call carrying n decisions and counts every decision's
	// outcome in t. Failures are outcomes too: call never fails as such.
	call(ctx context.Context, n int, t tally)
	close()
}

// dialer holds the connections every worker shares.
type dialer struct {
	cfg    Config
	conns  []*grpc.ClientConn
	health []healthpb.HealthClient
	limit  []rationv1.RateLimiterClient
	envoy  []rlsv3.RateLimitServiceClient
	// clients are the Go client's (-mode client), one per connection.
	clients []*client.Client
	http    *http.Client
	notes   []string
	// tls names what the preflight connection negotiated ("" in
	// plaintext), for the report.
	tls string
}

// dial opens the connections and checks that every target answers, so a
// wrong address fails at once with a clear error instead of a run full of
// errors.
func dial(ctx context.Context, cfg Config) (*dialer, error) {
	d := &dialer{cfg: cfg}
	tcfg := cfg.tlsConfig
	if tcfg == nil && cfg.TLS.enabled() { // a Config not made by parseFlags
		var err error
		if tcfg, err = cfg.TLS.config(); err != nil {
			return nil, err
		}
	}
	if cfg.Mode == modeHTTP {
		w := cfg.workers()
		d.http = &http.Client{Transport: &http.Transport{
			Proxy:               nil, // loopback only: never through a proxy
			MaxIdleConns:        w * len(cfg.HTTPTargets),
			MaxIdleConnsPerHost: w,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
			// HTTP/1.1 over TLS when tcfg is set: the agent's listener
			// offers no HTTP/2.
			TLSClientConfig: tcfg,
		}}
		for _, t := range cfg.HTTPTargets {
			if err := d.preflightHTTP(ctx, t); err != nil {
				d.close()
				return nil, err
			}
		}
		return d, nil
	}
	creds := insecure.NewCredentials()
	if tcfg != nil {
		creds = credentials.NewTLS(tcfg)
	}
	for i := range cfg.connCount() {
		target := cfg.Targets[i%len(cfg.Targets)]
		cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(creds))
		if err != nil {
			d.close()
			return nil, fmt.Errorf("-target %s: %w", target, err)
		}
		d.conns = append(d.conns, cc)
		d.health = append(d.health, healthpb.NewHealthClient(cc))
		d.limit = append(d.limit, rationv1.NewRateLimiterClient(cc))
		d.envoy = append(d.envoy, rlsv3.NewRateLimitServiceClient(cc))
		if cfg.Mode == modeClient {
			c, err := newGoClient(target, cfg, creds)
			if err != nil {
				d.close()
				return nil, err
			}
			d.clients = append(d.clients, c)
		}
	}
	for i, target := range cfg.Targets {
		if err := d.preflightGRPC(ctx, target, d.health[i%len(d.health)]); err != nil {
			d.close()
			return nil, err
		}
	}
	return d, nil
}

const preflightTimeout = 3 * time.Second

func (d *dialer) preflightGRPC(ctx context.Context, target string, hc healthpb.HealthClient) error {
	ctx, cancel := context.WithTimeout(ctx, preflightTimeout)
	defer cancel()
	var p peer.Peer
	resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p))
	if err != nil {
		return fmt.Errorf("-target %s: %w: grpc.health.v1 Health/Check failed (%s): %w",
			target, errUnreachable, d.cfg.TLS.dialHint(), err)
	}
	if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && d.tls == "" {
		d.tls = describeTLS(ti.State, d.cfg.TLS.Cert != "")
	}
	if s := resp.GetStatus(); s != healthpb.HealthCheckResponse_SERVING {
		d.notes = append(d.notes, fmt.Sprintf("target %s reported %v at start (store not answered yet?)", target, s))
	}
	return nil
}

func (d *dialer) preflightHTTP(ctx context.Context, target string) error {
	get := func(path string) (int, error) {
		ctx, cancel := context.WithTimeout(ctx, preflightTimeout)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.cfg.TLS.scheme()+"://"+target+path, nil)
		if err != nil {
			return 0, err
		}
		resp, err := d.http.Do(req)
		if err != nil {
			return 0, err
		}
		if resp.TLS != nil && d.tls == "" {
			d.tls = describeTLS(*resp.TLS, d.cfg.TLS.Cert != "")
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		_ = resp.Body.Close()
		return resp.StatusCode, nil
	}
	code, err := get("/healthz")
	if err != nil {
		return fmt.Errorf("-http-target %s: %w: GET /healthz (%s): %w", target, errUnreachable, d.cfg.TLS.dialHint(), err)
	}
	if code != http.StatusOK {
		return fmt.Errorf("-http-target %s: %w: GET /healthz answered %d (%s)", target, errUnreachable, code, d.cfg.TLS.dialHint())
	}
	if code, err := get("/readyz"); err != nil || code != http.StatusOK {
		d.notes = append(d.notes, fmt.Sprintf("http target %s was not ready at start (GET /readyz: %d %v)", target, code, err))
	}
	return nil
}

func (d *dialer) close() {
	for _, c := range d.clients {
		_ = c.Close()
	}
	for _, cc := range d.conns {
		_ = cc.Close()
	}
	if d.http != nil {
		d.http.CloseIdleConnections()
	}
}

// caller returns worker w's caller: connections and targets round-robin.
func (d *dialer) caller(w int) caller {
	gen := newRequestGen(d.cfg, w)
	timeout := d.cfg.Timeout
	switch d.cfg.Mode {
	case modeBatch:
		return &batchCaller{client: d.limit[w%len(d.limit)], gen: gen, timeout: timeout}
	case modeStream:
		return &streamCaller{client: d.limit[w%len(d.limit)], gen: gen, timeout: timeout}
	case modeHTTP:
		return newHTTPCaller(d.http, d.cfg.TLS.scheme()+"://"+d.cfg.HTTPTargets[w%len(d.cfg.HTTPTargets)], gen, timeout)
	case modeEmpty:
		return &emptyCaller{client: d.health[w%len(d.health)], timeout: timeout}
	case modeEnvoy:
		return &envoyCaller{client: d.envoy[w%len(d.envoy)], gen: gen, timeout: timeout}
	case modeClient:
		return &goClientCaller{client: d.clients[w%len(d.clients)], gen: gen}
	default:
		return &allowCaller{client: d.limit[w%len(d.limit)], gen: gen, timeout: timeout}
	}
}

// endpoint describes what the mode calls, for the report.
func endpoint(c Config) string {
	switch c.Mode {
	case modeBatch:
		return "ration.v1.RateLimiter/AllowBatch"
	case modeStream:
		return "ration.v1.RateLimiter/AllowStream"
	case modeHTTP:
		if c.Rule != "" || len(c.Mix) > 0 {
			return "POST /v1/allow"
		}
		return "GET /v1/check"
	case modeEmpty:
		return "grpc.health.v1.Health/Check"
	case modeEnvoy:
		return "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
	case modeClient:
		if c.Coalesce < 0 {
			return "client.Allow (unary Allow)"
		}
		return "client.Allow (coalescing into AllowBatch)"
	default:
		return "ration.v1.RateLimiter/Allow"
	}
}

type allowCaller struct {
	client  rationv1.RateLimiterClient
	gen     *requestGen
	timeout time.Duration
}

func (c *allowCaller) call(ctx context.Context, _ int, t tally) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := c.client.Allow(ctx, c.gen.next())
	if err != nil {
		t.add(kindError, grpcReason(err), 1)
		return
	}
	t.addAnswer(resp)
}

func (c *allowCaller) close() {}

type batchCaller struct {
	client  rationv1.RateLimiterClient
	gen     *requestGen
	timeout time.Duration
}

func (c *batchCaller) call(ctx context.Context, n int, t tally) {
	items := make([]rationv1.AllowRequest, n)
	req := &rationv1.AllowBatchRequest{Requests: make([]*rationv1.AllowRequest, n)}
	for i := range items {
		c.gen.fill(&items[i])
		req.Requests[i] = &items[i]
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := c.client.AllowBatch(ctx, req)
	if err != nil {
		t.add(kindError, grpcReason(err), int64(n))
		return
	}
	rs := resp.GetResponses()
	for i := range n {
		if i >= len(rs) {
			t.add(kindError, "missing_answer", int64(n-i))
			return
		}
		t.addAnswer(rs[i])
	}
}

func (c *batchCaller) close() {}

// streamCaller keeps one AllowStream open and has one request on it at a
// time; a broken stream is counted as an error and reopened on the next
// call.
type streamCaller struct {
	client  rationv1.RateLimiterClient
	gen     *requestGen
	timeout time.Duration
	stream  rationv1.RateLimiter_AllowStreamClient
	cancel  context.CancelFunc
}

func (c *streamCaller) call(ctx context.Context, _ int, t tally) {
	if c.stream == nil {
		sctx, cancel := context.WithCancel(ctx)
		s, err := c.client.AllowStream(sctx)
		if err != nil {
			cancel()
			t.add(kindError, grpcReason(err), 1)
			return
		}
		c.stream, c.cancel = s, cancel
	}
	// A stream has no per-message deadline: cancel it if one answer takes
	// longer than -timeout.
	timer := time.AfterFunc(c.timeout, c.cancel)
	err := c.stream.Send(c.gen.next())
	var resp *rationv1.AllowResponse
	if err == nil {
		resp, err = c.stream.Recv()
	} else if errors.Is(err, io.EOF) {
		_, err = c.stream.Recv() // the stream's real status
	}
	late := !timer.Stop()
	if err != nil {
		reason := grpcReason(err)
		if late {
			reason = "grpc:DeadlineExceeded"
		}
		t.add(kindError, reason, 1)
		c.close()
		return
	}
	t.addAnswer(resp)
}

func (c *streamCaller) close() {
	if c.stream != nil {
		_ = c.stream.CloseSend()
		c.cancel()
		c.stream, c.cancel = nil, nil
	}
}

// envoyDomain is the domain of every Envoy request. The agent passes it to
// the rules as descriptor "domain"; a rule that does not name that key
// applies to every domain.
const envoyDomain = "ration-bench"

// envoyCaller asks what Envoy's HTTP rate-limit filter asks: one
// descriptor, whose entries are the descriptors an allow call would send.
// Envoy's answer has no reason, so OK counts as "ok" and OVER_LIMIT as
// "over_limit"; a fail_open rule's answer while the store is down is an OK
// like any other (fail_closed answers UNAVAILABLE, an error here).
type envoyCaller struct {
	client  rlsv3.RateLimitServiceClient
	gen     *requestGen
	timeout time.Duration
}

func (c *envoyCaller) call(ctx context.Context, _ int, t tally) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var a rationv1.AllowRequest
	c.gen.fill(&a)
	d := &ratelimitv3.RateLimitDescriptor{Entries: make([]*ratelimitv3.RateLimitDescriptor_Entry, 0, len(a.Descriptors))}
	for _, k := range slices.Sorted(maps.Keys(a.Descriptors)) {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: a.Descriptors[k]})
	}
	req := &rlsv3.RateLimitRequest{Domain: envoyDomain, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}}
	if a.Cost > 0 {
		req.HitsAddend = uint32(a.Cost)
	}
	resp, err := c.client.ShouldRateLimit(ctx, req)
	switch {
	case err != nil:
		t.add(kindError, grpcReason(err), 1)
	case resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
		t.add(kindAllowed, "ok", 1)
	case resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT:
		t.add(kindDenied, "over_limit", 1)
	default:
		t.add(kindError, "envoy:"+strings.ToLower(resp.GetOverallCode().String()), 1)
	}
}

func (c *envoyCaller) close() {}

type emptyCaller struct {
	client  healthpb.HealthClient
	timeout time.Duration
}

func (c *emptyCaller) call(ctx context.Context, _ int, t tally) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := c.client.Check(ctx, &healthpb.HealthCheckRequest{})
	switch {
	case err != nil:
		t.add(kindError, grpcReason(err), 1)
	case resp.GetStatus() == healthpb.HealthCheckResponse_SERVING:
		t.add(kindAllowed, "serving", 1)
	default:
		t.add(kindDenied, strings.ToLower(resp.GetStatus().String()), 1)
	}
}

func (c *emptyCaller) close() {}

// httpCaller sends GET /v1/check?<descriptor-key>=<subject>[&fixed...] or,
// when requests name a rule, POST /v1/allow with {"rule","subject"}.
type httpCaller struct {
	client  *http.Client
	base    string // http://host:port or https://host:port
	gen     *requestGen
	timeout time.Duration
	suffix  string // escaped fixed descriptors and cost: "&k=v&cost=2"
	key     string // escaped descriptor key
}

func newHTTPCaller(client *http.Client, base string, gen *requestGen, timeout time.Duration) *httpCaller {
	c := &httpCaller{client: client, base: base, gen: gen, timeout: timeout, key: url.QueryEscape(gen.descKey)}
	var sb strings.Builder
	for _, k := range slices.Sorted(maps.Keys(gen.fixed)) {
		sb.WriteString("&" + url.QueryEscape(k) + "=" + url.QueryEscape(gen.fixed[k]))
	}
	if gen.cost != 1 {
		sb.WriteString("&cost=" + strconv.FormatFloat(gen.cost, 'g', -1, 64))
	}
	c.suffix = sb.String()
	return c
}

// allowBody is POST /v1/allow's request; allowAnswer the part of its
// answer counted here.
type allowBody struct {
	Rule    string  `json:"rule"`
	Subject string  `json:"subject"`
	Cost    float64 `json:"cost,omitempty"`
}

type allowAnswer struct {
	Allowed bool   `json:"allowed"`
	Reason  string `json:"reason"`
}

func (c *httpCaller) call(ctx context.Context, _ int, t tally) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var req *http.Request
	var err error
	post := c.gen.rules != nil
	if post {
		b := allowBody{Rule: c.gen.rules.next(), Subject: c.gen.subject()}
		if c.gen.cost != 1 {
			b.Cost = c.gen.cost
		}
		body, _ := json.Marshal(b)
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/v1/allow", bytes.NewReader(body))
		if err == nil {
			req.Header.Set("Content-Type", "application/json")
		}
	} else {
		u := c.base + "/v1/check?" + c.key + "=" + url.QueryEscape(c.gen.subject()) + c.suffix
		req, err = http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	}
	if err != nil {
		t.add(kindError, "http:request", 1)
		return
	}
	resp, err := c.client.Do(req)
	if err != nil {
		reason := "http:transport"
		if errors.Is(err, context.DeadlineExceeded) {
			reason = "http:timeout"
		}
		t.add(kindError, reason, 1)
		return
	}
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		_ = resp.Body.Close()
	}()
	if post {
		var a allowAnswer
		if resp.StatusCode != http.StatusOK {
			t.add(kindError, "http:"+strconv.Itoa(resp.StatusCode), 1)
		} else if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&a); err != nil {
			t.add(kindError, "http:bad_answer", 1)
		} else if a.Allowed {
			t.add(kindAllowed, a.Reason, 1)
		} else {
			t.add(kindDenied, a.Reason, 1)
		}
		return
	}
	reason := resp.Header.Get("X-Ration-Reason")
	switch resp.StatusCode {
	case http.StatusOK:
		t.add(kindAllowed, cmp.Or(reason, "ok"), 1)
	case http.StatusTooManyRequests:
		t.add(kindDenied, cmp.Or(reason, "over_limit"), 1)
	case http.StatusServiceUnavailable:
		t.add(kindDenied, cmp.Or(reason, "unavailable"), 1)
	default:
		t.add(kindError, "http:"+strconv.Itoa(resp.StatusCode), 1)
	}
}

func (c *httpCaller) close() {}
