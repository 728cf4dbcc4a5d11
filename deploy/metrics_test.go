package deploy

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// family is what the binaries export under one metric name: its type, and
// the label values seen per label name.
type family struct {
	typ    dto.MetricType
	help   string
	labels map[string]map[string]bool
	from   map[string]bool // which binaries export it
}

type exported map[string]*family

// testRegion is the region overlay the metrics test runs.
const testRegion = "eu-west-1"

var leasePeriod = regexp.MustCompile(`period: \d+s`)

var (
	exportedOnce sync.Mutex
	exportedMemo exported
)

// exportedMetrics runs a coordinator and two agents built from this
// repository on loopback, drives every decision path through them (the
// Redis path against -dev's in-memory store, the lease path against the
// coordinator, and the failure policies against an agent whose Redis is a
// closed port), then stops the coordinator so that lease renewals fail, and
// returns everything their /metrics served. Vector metrics appear only once
// a label combination has been used, which is why the paths are driven.
// The result is computed once per test binary.
func exportedMetrics(t *testing.T) exported {
	t.Helper()
	exportedOnce.Lock()
	defer exportedOnce.Unlock()
	if exportedMemo != nil {
		return exportedMemo
	}

	// The overlays' rules, with every lease period cut to 2s so that
	// renewals follow the coordinators' exits within a second or two.
	all := manifestRules(t)
	shorten := func(dir string) string {
		rules, ok := all[filepath.Join(kubeDir, "overlays", dir)]
		if !ok {
			t.Fatalf("no overlay %s", dir)
		}
		fast := leasePeriod.ReplaceAllString(rules, "period: 2s")
		if fast == rules {
			t.Fatalf("overlay %s: no lease period to shorten", dir)
		}
		return fast
	}
	regionRules, globalRules := shorten(testRegion), shorten("global")
	globalFile := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(globalFile, []byte(globalRules), 0o644); err != nil {
		t.Fatal(err)
	}
	// Mounted the way the kubelet mounts a ConfigMap volume, so that the
	// reload below goes through the same symlink swap.
	cm := newConfigMapDir(t)
	cm.write(t, "rules.yaml", regionRules)
	rulesFile := filepath.Join(cm.dir, "rules.yaml")

	// The hierarchy: the global group, the region's group leasing from it,
	// the region's agents.
	loopback := []string{"-raft", "127.0.0.1:0", "-grpc", "127.0.0.1:0", "-http", "127.0.0.1:0", "-admin", "127.0.0.1:0"}
	global := start(t, "coordinator", nil, append([]string{"-dev", "-rules", globalFile}, loopback...)...)
	m := global.wait(t, coordStarted, 30*time.Second)
	globalGRPC, globalHTTP := m[1], m[2]
	coord := start(t, "coordinator", nil, append([]string{"-dev", "-rules", rulesFile, "-region", testRegion, "-upstream", globalGRPC}, loopback...)...)
	m = coord.wait(t, coordStarted, 30*time.Second)
	coordGRPC, coordHTTP, coordAdmin := m[1], m[2], m[3]
	for _, h := range []string{globalHTTP, coordHTTP} {
		eventually(t, 20*time.Second, "coordinator /readyz", func() bool {
			code, _ := httpGet(t, "http://"+h+"/readyz")
			return code == 200
		})
	}

	agentArgs := []string{"-rules", rulesFile, "-region", testRegion, "-coordinators", coordGRPC, "-insecure",
		"-http", "127.0.0.1:0", "-grpc", "127.0.0.1:0", "-reload-interval", "100ms"}
	healthy := start(t, "gateway-agent", nil, append([]string{"-dev", "-id", "agent-healthy"}, agentArgs...)...)
	healthyHTTP := healthy.wait(t, agentStarted, 30*time.Second)[2]
	broken := start(t, "gateway-agent", nil, append([]string{"-redis", closedPort(t), "-id", "agent-broken"}, agentArgs...)...)
	brokenHTTP := broken.wait(t, agentStarted, 30*time.Second)[2]

	allow := func(addr, body string) string {
		_, resp := httpPost(t, "http://"+addr+"/v1/allow", body)
		return resp
	}
	search := `{"descriptors":{"tenant":"acme","endpoint":"search"},"cost":100}`
	export := `{"descriptors":{"endpoint":"export"}}`
	partner := `{"descriptors":{"partner":"p1"}}`
	allow(healthyHTTP, search)
	if r := allow(healthyHTTP, search); !strings.Contains(r, `"over_limit"`) {
		t.Fatalf("second search of cost 100 on the healthy agent: %s, want over_limit", r)
	}
	allow(healthyHTTP, `{"descriptors":{"unmatched":"x"}}`)
	if code, _ := httpPost(t, "http://"+healthyHTTP+"/v1/allow", `{"descriptors":{}}`); code != 400 {
		t.Errorf("empty descriptors: HTTP %d, want 400", code)
	}
	eventually(t, 20*time.Second, "a leased decision on the healthy agent", func() bool {
		return strings.Contains(allow(healthyHTTP, export), `"reason":"ok"`)
	})
	// A retry with the same request id is answered from the agent's record
	// (ration_request_id_replays_total).
	replayed := `{"descriptors":{"endpoint":"export"},"request_id":"metrics-test-1"}`
	allow(healthyHTTP, replayed)
	allow(healthyHTTP, replayed)
	eventually(t, 20*time.Second, "a decision of a global leased rule on the healthy agent", func() bool {
		return strings.Contains(allow(healthyHTTP, partner), `"reason":"ok"`)
	})
	for range 5 {
		allow(brokenHTTP, `{"descriptors":{"tenant":"acme","endpoint":"search"}}`)
		allow(brokenHTTP, export)
	}

	scrape := func(name, addr string) map[string]*dto.MetricFamily {
		code, body := httpGet(t, "http://"+addr+"/metrics")
		if code != 200 {
			t.Fatalf("%s /metrics: HTTP %d", name, code)
		}
		p := expfmt.NewTextParser(model.LegacyValidation)
		fams, err := p.TextToMetricFamilies(strings.NewReader(body))
		if err != nil {
			t.Fatalf("%s /metrics: %v", name, err)
		}
		return fams
	}
	has := func(fams map[string]*dto.MetricFamily, name string, lbls ...string) bool {
		f := fams[name]
		if f == nil {
			return false
		}
	metrics:
		for _, mt := range f.Metric {
			for i := 0; i+1 < len(lbls); i += 2 {
				found := false
				for _, lp := range mt.Label {
					found = found || lp.GetName() == lbls[i] && lp.GetValue() == lbls[i+1]
				}
				if !found {
					continue metrics
				}
			}
			return true
		}
		return false
	}
	eventually(t, 10*time.Second, "broken agent: breaker open and a fallback episode", func() bool {
		f := scrape("broken agent", brokenHTTP)
		return has(f, "ration_fallback_activations_total") && has(f, "ration_breaker_open") &&
			f["ration_breaker_open"].Metric[0].GetGauge().GetValue() == 1
	})
	eventually(t, 10*time.Second, "healthy agent: a renewal", func() bool {
		return has(scrape("healthy agent", healthyHTTP), "ration_agent_lease_renewals_total", "result", "ok")
	})
	// A ConfigMap update: an invalid file is rejected (and counted), the
	// next valid one is loaded.
	cm.write(t, "rules.yaml", "rules: [\n")
	eventually(t, 10*time.Second, "healthy agent: the invalid rules file rejected", func() bool {
		return has(scrape("healthy agent", healthyHTTP), "ration_rules_reloads_total", "result", "error")
	})
	cm.write(t, "rules.yaml", regionRules+"\n# changed\n")
	eventually(t, 10*time.Second, "healthy agent: the changed rules file loaded", func() bool {
		return has(scrape("healthy agent", healthyHTTP), "ration_rules_reloads_total", "result", "ok")
	})
	eventually(t, 10*time.Second, "regional coordinator: an upstream renewal", func() bool {
		return has(scrape("regional coordinator", coordHTTP), "ration_coordinator_upstream_renewals_total", "result", "ok")
	})
	// An operator's run-time tuning, as the runbook does it.
	if out, err := exec.Command(binary(t, "coordinator"), "tune", "-addr", coordAdmin,
		"-rule", "export", "-region", testRegion, "-min-slice", "1").CombinedOutput(); err != nil {
		t.Fatalf("coordinator tune: %v\n%s", err, out)
	}
	eventually(t, 10*time.Second, "regional coordinator: the tuning exported", func() bool {
		return has(scrape("regional coordinator", coordHTTP), "ration_coordinator_tuning", "rule", "export")
	})
	globalFams := scrape("global coordinator", globalHTTP)
	logRSS(t, map[string]*proc{"coordinator (regional)": coord, "coordinator (global)": global, "gateway-agent (healthy)": healthy})

	// Without the global group, upstream renewals fail; without the
	// regional group, the agents' renewals fail.
	global.stop(t)
	eventually(t, 20*time.Second, "regional coordinator: a failed upstream renewal after the global group stopped", func() bool {
		return has(scrape("regional coordinator", coordHTTP), "ration_coordinator_upstream_renewals_total", "result", "error")
	})
	coordFams := mergeFamilies(globalFams, scrape("regional coordinator", coordHTTP))
	coord.stop(t)
	eventually(t, 20*time.Second, "healthy agent: a failed renewal after the coordinator stopped", func() bool {
		return has(scrape("healthy agent", healthyHTTP), "ration_agent_lease_renewals_total", "result", "error")
	})

	out := exported{}
	for name, fams := range map[string]map[string]*dto.MetricFamily{
		"coordinator":   coordFams,
		"gateway-agent": mergeFamilies(scrape("healthy agent", healthyHTTP), scrape("broken agent", brokenHTTP)),
	} {
		for n, f := range fams {
			e := out[n]
			if e == nil {
				e = &family{typ: f.GetType(), help: f.GetHelp(), labels: map[string]map[string]bool{}, from: map[string]bool{}}
				out[n] = e
			}
			e.from[name] = true
			for _, mt := range f.Metric {
				for _, lp := range mt.Label {
					if e.labels[lp.GetName()] == nil {
						e.labels[lp.GetName()] = map[string]bool{}
					}
					e.labels[lp.GetName()][lp.GetValue()] = true
				}
			}
		}
	}
	exportedMemo = out
	return out
}

func mergeFamilies(a, b map[string]*dto.MetricFamily) map[string]*dto.MetricFamily {
	out := map[string]*dto.MetricFamily{}
	for _, m := range []map[string]*dto.MetricFamily{a, b} {
		for n, f := range m {
			if o, ok := out[n]; ok {
				o.Metric = append(o.Metric, f.Metric...)
			} else {
				out[n] = f
			}
		}
	}
	return out
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// logRSS prints the resident memory of the processes, the figure the
// manifests' memory requests are sized from (docs/performance.md has no
// memory figures).
func logRSS(t testing.TB, ps map[string]*proc) {
	t.Helper()
	names := make([]string, 0, len(ps))
	for n := range ps {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", ps[n].cmd.Process.Pid))
		if err != nil {
			continue
		}
		if m := regexp.MustCompile(`VmRSS:\s+(\d+) kB`).FindSubmatch(b); m != nil {
			kb, _ := strconv.Atoi(string(m[1]))
			t.Logf("%s: RSS %d MiB after the test's traffic", n, kb/1024)
		}
	}
}

// TestMetricsExported is a smoke test of the collection itself: both
// binaries' own series and every decision path are there.
func TestMetricsExported(t *testing.T) {
	ex := exportedMetrics(t)
	for _, name := range []string{
		"ration_coordinator_upstream_renewals_total", "ration_coordinator_quota_funded_burst_tokens",
		"ration_decisions_total", "ration_decision_duration_seconds", "ration_fallback_active",
		"ration_overshoot_bound_tokens", "ration_agent_lease_renewals_total",
		"ration_coordinator_leader_ready", "ration_coordinator_quota_pool_tokens",
		"ration_coordinator_apply_duration_seconds",
	} {
		if ex[name] == nil {
			t.Errorf("%s not exported", name)
		}
	}
	// Both binaries say which build they are, stamped as the Dockerfile
	// stamps them.
	if b := ex["ration_build_info"]; b == nil || !b.from["gateway-agent"] || !b.from["coordinator"] {
		t.Errorf("ration_build_info not exported by both binaries: %+v", b)
	} else {
		for k, v := range map[string]string{"version": dockerBuildArgs["VERSION"], "commit": dockerBuildArgs["COMMIT"]} {
			if len(b.labels[k]) != 1 || !b.labels[k][v] {
				t.Errorf("ration_build_info{%s} = %v, want only %q", k, sortedKeys(b.labels[k]), v)
			}
		}
	}
	if d := ex["ration_decisions_total"]; d != nil {
		for _, p := range []string{"store", "leased", "fallback"} {
			if !d.labels["path"][p] {
				t.Errorf("ration_decisions_total{path=%q} not seen: the test did not drive that path", p)
			}
		}
	}
}

// configMapDir lays files out as the kubelet does for a ConfigMap volume:
// each version in its own hidden directory, "..data" a symlink to the
// current one, and every key a symlink through "..data". An update
// replaces "..data" atomically (a rename), never the files in place.
type configMapDir struct {
	dir string
	n   int
}

func newConfigMapDir(t testing.TB) *configMapDir {
	return &configMapDir{dir: t.TempDir()}
}

func (c *configMapDir) write(t testing.TB, key, content string) {
	t.Helper()
	c.n++
	version := fmt.Sprintf("..2026_11_30_00_00_00.%d", c.n)
	if err := os.Mkdir(filepath.Join(c.dir, version), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.dir, version, key), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(c.dir, "..data_tmp")
	if err := os.Symlink(version, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(c.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(c.dir, key)
	if _, err := os.Lstat(link); os.IsNotExist(err) {
		if err := os.Symlink(filepath.Join("..data", key), link); err != nil {
			t.Fatal(err)
		}
	}
}
