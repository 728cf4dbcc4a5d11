package agent_test

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	ratelimitfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/rules"
)

const envoyDoc = "../../docs/integrations/envoy.md"

// yamlBlocks returns the ```yaml blocks of a markdown file.
func yamlBlocks(t *testing.T, path string) []string {
	t.Helper()
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	rest := string(doc)
	for {
		_, after, ok := strings.Cut(rest, "```yaml\n")
		if !ok {
			return out
		}
		block, tail, ok := strings.Cut(after, "```")
		if !ok {
			t.Fatalf("%s: unterminated ```yaml block", path)
		}
		out = append(out, block)
		rest = tail
	}
}

// documentedEnvoy parses the doc's Envoy configuration with Envoy's API
// types (typed_config resolved) and checks it with their generated
// validation rules; it returns the bootstrap and the doc's rules.
func documentedEnvoy(t *testing.T) (*bootstrapv3.Bootstrap, *rules.Set) {
	t.Helper()
	var envoyYAML, rulesYAML string
	for _, b := range yamlBlocks(t, envoyDoc) {
		switch {
		case strings.HasPrefix(b, "static_resources:") && envoyYAML == "":
			envoyYAML = b
		case strings.HasPrefix(b, "rules:") && rulesYAML == "":
			rulesYAML = b
		}
	}
	if envoyYAML == "" || rulesYAML == "" {
		t.Fatalf("%s: want a ```yaml block starting with static_resources: and one starting with rules:", envoyDoc)
	}
	var tree any
	if err := yaml.Unmarshal([]byte(envoyYAML), &tree); err != nil {
		t.Fatalf("Envoy YAML: %v", err)
	}
	js, err := json.Marshal(tree)
	if err != nil {
		t.Fatalf("Envoy YAML as JSON: %v", err)
	}
	boot := &bootstrapv3.Bootstrap{}
	if err := protojson.Unmarshal(js, boot); err != nil {
		t.Fatalf("the documented Envoy configuration does not parse as envoy.config.bootstrap.v3.Bootstrap: %v", err)
	}
	if err := validateDeep(boot); err != nil {
		t.Fatalf("the documented Envoy configuration fails Envoy's validation rules: %v", err)
	}
	set, err := rules.Parse("envoy.md rules", []byte(rulesYAML))
	if err != nil {
		t.Fatalf("the documented rules: %v", err)
	}
	return boot, set
}

// validateDeep runs the generated validation of m and of every message in
// it, unpacking typed_config and other Any fields (which ValidateAll does
// not enter), as Envoy does when it loads a configuration.
func validateDeep(m proto.Message) error {
	if v, ok := m.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			return fmt.Errorf("%s: %w", m.ProtoReflect().Descriptor().FullName(), err)
		}
	}
	var err error
	visit := func(v protoreflect.Message) bool {
		msg := v.Interface()
		if a, ok := msg.(*anypb.Any); ok {
			inner, uerr := a.UnmarshalNew()
			if uerr != nil {
				err = fmt.Errorf("typed_config %s: %w", a.GetTypeUrl(), uerr)
				return false
			}
			msg = inner
		}
		err = validateDeep(msg)
		return err == nil
	}
	m.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i := 0; i < v.List().Len(); i++ {
				if !visit(v.List().Get(i).Message()) {
					return false
				}
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool { return visit(mv.Message()) })
		case fd.Message() != nil && !fd.IsMap():
			return visit(v.Message())
		}
		return err == nil
	})
	return err
}

// documentedFilterAndRoutes digs out the rate-limit filter and the routes.
func documentedFilterAndRoutes(t *testing.T, boot *bootstrapv3.Bootstrap) (*ratelimitfilterv3.RateLimit, []*routev3.Route) {
	t.Helper()
	var filter *ratelimitfilterv3.RateLimit
	var routes []*routev3.Route
	for _, l := range boot.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				hcm := &hcmv3.HttpConnectionManager{}
				if err := f.GetTypedConfig().UnmarshalTo(hcm); err != nil {
					continue
				}
				for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
					routes = append(routes, vh.GetRoutes()...)
				}
				for _, hf := range hcm.GetHttpFilters() {
					rl := &ratelimitfilterv3.RateLimit{}
					if hf.GetTypedConfig().UnmarshalTo(rl) == nil {
						filter = rl
					}
				}
			}
		}
	}
	if filter == nil || len(routes) == 0 {
		t.Fatal("the documented configuration has no rate-limit filter or no routes")
	}
	return filter, routes
}

// envoyDescriptors builds the descriptors Envoy's route actions produce for
// a request, for the action kinds the doc uses (an unknown kind fails the
// test, so the doc stays within what this test can check). A rate limit
// entry with an action that produces nothing (a missing header) sends no
// descriptor, as in Envoy.
func envoyDescriptors(t *testing.T, route *routev3.Route, remoteAddr string, headers map[string]string) []*ratelimitv3.RateLimitDescriptor {
	t.Helper()
	var out []*ratelimitv3.RateLimitDescriptor
next:
	for _, rl := range route.GetRoute().GetRateLimits() {
		d := &ratelimitv3.RateLimitDescriptor{}
		for _, a := range rl.GetActions() {
			var k, v string
			switch {
			case a.GetRemoteAddress() != nil:
				k, v = "remote_address", remoteAddr
			case a.GetRequestHeaders() != nil:
				rh := a.GetRequestHeaders()
				var ok bool
				if v, ok = headers[rh.GetHeaderName()]; !ok {
					continue next
				}
				k = rh.GetDescriptorKey()
			case a.GetGenericKey() != nil:
				k, v = a.GetGenericKey().GetDescriptorKey(), a.GetGenericKey().GetDescriptorValue()
				if k == "" {
					k = "generic_key"
				}
			default:
				t.Fatalf("the documented route uses an action this test does not model: %v", a)
			}
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: v})
		}
		out = append(out, d)
	}
	return out
}

// The documented Envoy configuration is valid for Envoy's API, sets the
// filter as the failure table says, and with the documented rules does
// what the page says for a search request.
func TestEnvoyDocumentedConfiguration(t *testing.T) {
	boot, set := documentedEnvoy(t)
	filter, routes := documentedFilterAndRoutes(t, boot)
	if !filter.GetFailureModeDeny() || filter.GetStatusOnError().GetCode() != 503 {
		t.Fatalf("filter failure_mode_deny %v, status_on_error %v: the page recommends true and 503", filter.GetFailureModeDeny(), filter.GetStatusOnError())
	}
	if d := filter.GetTimeout().AsDuration(); d <= agent.DefaultConfig().DecisionTimeout {
		t.Fatalf("filter timeout %v is not above the agent's default -decision-timeout %v", d, agent.DefaultConfig().DecisionTimeout)
	}
	if filter.GetEnableXRatelimitHeaders() != ratelimitfilterv3.RateLimit_OFF {
		t.Fatal("the page says to leave enable_x_ratelimit_headers off")
	}
	if filter.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName() != "ration_agent" {
		t.Fatal("the filter does not call the ration_agent cluster")
	}

	var search *routev3.Route
	for _, r := range routes {
		if r.GetMatch().GetPrefix() == "/api/search" {
			search = r
		}
	}
	if search == nil {
		t.Fatal("no /api/search route in the documented configuration")
	}

	var rulesText strings.Builder
	rulesText.WriteString("rules:\n")
	for _, b := range yamlBlocks(t, envoyDoc) {
		if strings.HasPrefix(b, "rules:") {
			rulesText.WriteString(strings.TrimPrefix(b, "rules:\n"))
			break
		}
	}
	a := startAgent(t, rulesText.String())
	c := envoyClient(t, a)
	req := &rlsv3.RateLimitRequest{
		Domain:      filter.GetDomain(),
		Descriptors: envoyDescriptors(t, search, "10.1.2.3", map[string]string{"x-user-id": "alice"}),
	}
	resp := shouldRateLimit(t, c, req)
	if resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("a first search = %v, want OK", resp)
	}
	var names []string
	for _, st := range resp.Statuses {
		names = append(names, st.GetCurrentLimit().GetName())
	}
	var want []string
	for _, r := range set.Rules() {
		want = append(want, r.Name)
	}
	if strings.Join(names, ",") != strings.Join(want, ",") {
		t.Fatalf("a search with a user is decided by %v, want every documented rule %v, one per descriptor", names, want)
	}
	if got := envoyHeaders(t, resp)["RateLimit-Policy"]; !strings.Contains(got, `"per-ip";q=50;w=5`) || !strings.Contains(got, `"search-per-user";q=20;w=20`) {
		t.Fatalf("RateLimit-Policy = %q, want both documented policies", got)
	}
	// Without the user header Envoy sends one descriptor, limited per address.
	anon := &rlsv3.RateLimitRequest{Domain: filter.GetDomain(), Descriptors: envoyDescriptors(t, search, "10.1.2.3", nil)}
	if len(anon.Descriptors) != 1 {
		t.Fatalf("an anonymous search gives %d descriptors, want 1", len(anon.Descriptors))
	}
	if resp := shouldRateLimit(t, c, anon); resp.Statuses[0].GetCurrentLimit().GetName() != "per-ip" {
		t.Fatalf("anonymous search = %v, want decided by per-ip", resp)
	}
}
