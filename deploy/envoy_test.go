package deploy

import (
	"os"
	"path/filepath"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"
)

// TestEnvoyBootstrap decodes the example gateway's Envoy bootstrap into
// Envoy's own Bootstrap type (unknown fields and unknown typed_config
// types rejected) and runs the validation rules Envoy's API declares; then
// checks the rate-limit filter is set up as the agent's Envoy API expects.
func TestEnvoyBootstrap(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(kubeDir, "gateway", "envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSONStrict(b)
	if err != nil {
		t.Fatalf("envoy.yaml: %v", err)
	}
	var bs bootstrapv3.Bootstrap
	if err := (protojson.UnmarshalOptions{}).Unmarshal(j, &bs); err != nil {
		t.Fatalf("envoy.yaml does not decode as envoy.config.bootstrap.v3.Bootstrap: %v", err)
	}
	if err := bs.ValidateAll(); err != nil {
		t.Fatalf("envoy.yaml: %v", err)
	}

	// The ingress listener's rate-limit filter.
	var rl *ratelimitv3.RateLimit
	for _, l := range bs.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				var hcm hcmv3.HttpConnectionManager
				if err := f.GetTypedConfig().UnmarshalTo(&hcm); err != nil {
					continue
				}
				for _, hf := range hcm.GetHttpFilters() {
					var r ratelimitv3.RateLimit
					if hf.GetTypedConfig().UnmarshalTo(&r) == nil {
						rl = &r
					}
				}
			}
		}
	}
	if rl == nil {
		t.Fatal("no envoy.filters.http.ratelimit filter")
	}
	if !rl.GetFailureModeDeny() || rl.GetStatusOnError().GetCode() != 503 {
		t.Error("rate-limit filter: want failure_mode_deny and status_on_error 503, or fail_closed rules fail open when the agent is down")
	}
	cluster := rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName()
	found := false
	for _, c := range bs.GetStaticResources().GetClusters() {
		if c.GetName() != cluster {
			continue
		}
		found = true
		if len(c.GetTypedExtensionProtocolOptions()) == 0 {
			t.Errorf("cluster %s: gRPC needs HTTP/2 (typed_extension_protocol_options)", cluster)
		}
	}
	if !found {
		t.Errorf("rate-limit service cluster %q is not defined", cluster)
	}
}
