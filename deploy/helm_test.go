package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8sjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// The Helm chart (deploy/helm/ration) renders what the kustomize overlays
// render. Its tests render it with Helm's own Go library (the chart loader,
// the values coalescing and schema validation, the template engine: what
// `helm template` runs), decode every object strictly as the kustomize
// tests do, and compare each example values file with the overlay of the
// same name, object by object, so that the two cannot drift.

var (
	chartDir    = filepath.Join("helm", "ration")
	examplesDir = filepath.Join("helm", "examples")
)

// chartScheme has the kustomize tests' API groups and the Prometheus
// Operator's (PrometheusRule, ServiceMonitor, PodMonitor), with its own Go
// types: strict decoding refuses a field the CRDs do not define.
var chartScheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, policyv1.AddToScheme, networkingv1.AddToScheme, monitoringv1.AddToScheme, addCertManager} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}()

var chartDecoder = k8sjson.NewSerializerWithOptions(k8sjson.DefaultMetaFactory, chartScheme, chartScheme, k8sjson.SerializerOptions{Yaml: true, Strict: true})

// helmLabels are the labels the chart adds to every object's metadata
// (never to selectors or pod templates): the only difference it may have
// from the kustomize rendering, with the checksum/* pod annotations that
// roll pods when a file they read only at start changes.
var helmLabels = []string{"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version"}

func loadChart(t testing.TB) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("loading the chart: %v", err)
	}
	return ch
}

// renderChart is `helm template ration deploy/helm/ration -n ns` with
// values, on Kubernetes 1.29 (the chart's lowest). The engine is strict: a
// template reading a value that does not exist is an error.
func renderChart(t testing.TB, values map[string]any, ns string) (map[string]string, error) {
	t.Helper()
	ch := loadChart(t)
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = chartutil.KubeVersion{Version: "v1.29.0", Major: "1", Minor: "29"}
	vals, err := chartutil.ToRenderValues(ch, values, chartutil.ReleaseOptions{Name: "ration", Namespace: ns, Revision: 1, IsInstall: true}, caps)
	if err != nil {
		return nil, err
	}
	return engine.Engine{Strict: true}.Render(ch, vals)
}

// chartRendering renders the chart and decodes every manifest strictly.
func chartRendering(t testing.TB, what string, values map[string]any, ns string) rendering {
	t.Helper()
	out, err := renderChart(t, values, ns)
	if err != nil {
		t.Fatalf("%s: rendering the chart: %v", what, err)
	}
	r := rendering{dir: "chart " + what}
	for _, name := range sortedKeys(out) {
		if strings.HasSuffix(name, "NOTES.txt") {
			continue
		}
		for i, doc := range splitYAML([]byte(out[name])) {
			obj, _, err := chartDecoder.Decode(doc, nil, nil)
			if err != nil {
				t.Errorf("%s: %s document %d: %v\n%s", what, name, i+1, err, doc)
				continue
			}
			m, err := meta.Accessor(obj)
			if err != nil {
				t.Fatal(err)
			}
			// helm template | kubectl apply must put it in the release's
			// namespace, as kustomize's namespace: does.
			if m.GetNamespace() != ns {
				t.Errorf("%s: %s %s: namespace %q, want the release's %q", what, kindOf(t, obj), m.GetName(), m.GetNamespace(), ns)
			}
			if m.GetLabels()["app.kubernetes.io/managed-by"] != "Helm" {
				t.Errorf("%s: %s %s: no Helm labels", what, kindOf(t, obj), m.GetName())
			}
			r.objs = append(r.objs, obj)
		}
	}
	if len(r.objs) == 0 {
		t.Fatalf("%s: the chart rendered nothing", what)
	}
	return r
}

func kindOf(t testing.TB, o runtime.Object) string {
	t.Helper()
	gvks, _, err := chartScheme.ObjectKinds(o)
	if err != nil || len(gvks) == 0 {
		t.Fatalf("%T: no kind: %v", o, err)
	}
	return gvks[0].Kind
}

func objName(t testing.TB, o runtime.Object) string {
	t.Helper()
	m, err := meta.Accessor(o)
	if err != nil {
		t.Fatal(err)
	}
	return m.GetName()
}

// readValues reads a values file as `helm -f` does.
func readValues(t testing.TB, path string) map[string]any {
	t.Helper()
	v, err := chartutil.ReadValuesFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return v.AsMap()
}

// overlayValues returns the example values of an overlay, with its rules
// file as `--set-file rules=OVERLAY/rules.yaml` gives it, and the
// overlay's namespace.
func overlayValues(t testing.TB, dir string) (map[string]any, string) {
	t.Helper()
	p := filepath.Join(examplesDir, filepath.Base(dir)+".yaml")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("overlay %s has no example values for the chart: want %s, rendering what the overlay renders", dir, p)
	}
	v := readValues(t, p)
	rules, err := os.ReadFile(filepath.Join(dir, "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	v["rules"] = string(rules)
	k := readKustomization(t, dir)
	if k.Namespace == "" {
		t.Fatalf("%s: no namespace", dir)
	}
	return v, k.Namespace
}

// withNamespace adds the Namespace that `helm install --create-namespace`
// (or the operator) creates, for the kustomize tests' checks, which look
// for it in the rendering.
func withNamespace(r rendering, ns string) rendering {
	r.objs = append(slices.Clone(r.objs), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	return r
}

// TestChartMatchesOverlays renders the chart with each overlay's example
// values (deploy/helm/examples/OVERLAY.yaml) and compares it with the
// overlay built by kustomize: the same kinds and names, and every field of
// every object equal (containers' command, args, env, ports, probes,
// resources, volumes; Services, PodDisruptionBudget, NetworkPolicies,
// ConfigMaps' data), save the Helm labels, the order of env entries (a
// kustomize patch moves the entries it adds to the front; each rendering's
// order is checked on its own, for $(VAR) references), and the name suffix
// kustomize gives a generated ConfigMap. The Namespace is the overlay's
// alone: Helm creates it with --create-namespace. Then the kustomize
// tests' own checks run on the chart's rendering.
func TestChartMatchesOverlays(t *testing.T) {
	for _, dir := range overlays(t) {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			values, ns := overlayValues(t, dir)
			kr := render(t, dir)
			cr := chartRendering(t, filepath.Base(dir), values, ns)
			if t.Failed() {
				return
			}
			compareRenderings(t, cr, kr)

			r := withNamespace(cr, ns)
			checkCoordinator(t, r)
			checkCertManager(t, r)
			checkCoordinatorCert(t, r, agentCoordinatorHosts(t, r))
			if get[*appsv1.Deployment](r, "gateway") != nil {
				checkGateway(t, r)
			}
			checkNetworkPolicies(t, r)
		})
	}
}

type objKey struct{ kind, name string }

func compareRenderings(t *testing.T, chartR, kustR rendering) {
	t.Helper()
	index := func(r rendering) map[objKey]runtime.Object {
		m := map[objKey]runtime.Object{}
		for _, o := range r.objs {
			k := objKey{kindOf(t, o), objName(t, o)}
			if _, dup := m[k]; dup {
				t.Errorf("%s: %s %s twice", r.dir, k.kind, k.name)
			}
			m[k] = o
		}
		return m
	}
	c, k := index(chartR), index(kustR)

	// kustomize's generated ConfigMaps carry a hash of their content in the
	// name (a new name rolls the pods); the chart rolls them with a
	// checksum annotation instead, under the plain name.
	hashed := map[string]string{}
	for key := range k {
		if key.kind != "ConfigMap" {
			continue
		}
		if i := strings.LastIndex(key.name, "-"); i > 0 {
			if _, ok := c[objKey{"ConfigMap", key.name[:i]}]; ok {
				hashed[key.name] = key.name[:i]
			}
		}
	}
	for from, to := range hashed {
		k[objKey{"ConfigMap", to}] = k[objKey{"ConfigMap", from}]
		delete(k, objKey{"ConfigMap", from})
	}

	var only []string
	for key := range k {
		if _, ok := c[key]; !ok && key.kind != "Namespace" {
			only = append(only, fmt.Sprintf("%s %s only in %s", key.kind, key.name, kustR.dir))
		}
	}
	for key := range c {
		if _, ok := k[key]; !ok {
			only = append(only, fmt.Sprintf("%s %s only in %s", key.kind, key.name, chartR.dir))
		}
	}
	sort.Strings(only)
	for _, s := range only {
		t.Error(s)
	}

	keys := slices.Collect(maps.Keys(c))
	sort.Slice(keys, func(i, j int) bool { return keys[i].kind+"/"+keys[i].name < keys[j].kind+"/"+keys[j].name })
	for _, key := range keys {
		ko, ok := k[key]
		if !ok {
			continue
		}
		cu := toTree(t, c[key])
		ku := toTree(t, ko)
		renameStrings(ku, hashed)
		if md, ok := cu["metadata"].(map[string]any); ok {
			if l, ok := md["labels"].(map[string]any); ok {
				for _, h := range helmLabels {
					delete(l, h)
				}
			}
		}
		if tpl, ok := dig(cu, "spec", "template", "metadata").(map[string]any); ok {
			if a, ok := tpl["annotations"].(map[string]any); ok {
				for name := range a {
					if strings.HasPrefix(name, "checksum/") {
						delete(a, name)
					}
				}
			}
		}
		sortEnv(cu)
		sortEnv(ku)
		var diffs []string
		diffTrees(key.kind+" "+key.name, cu, ku, &diffs)
		for _, d := range diffs {
			t.Error(d)
		}
	}
}

// toTree turns a typed object into its JSON form, as the API server would
// store it.
func toTree(t testing.TB, o runtime.Object) map[string]any {
	t.Helper()
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func dig(v any, path ...string) any {
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[p]
	}
	return v
}

// renameStrings replaces every string value found in names, in place.
func renameStrings(v any, names map[string]string) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if s, ok := x.(string); ok {
				if n, ok := names[s]; ok {
					v[k] = n
				}
				continue
			}
			renameStrings(x, names)
		}
	case []any:
		for i, x := range v {
			if s, ok := x.(string); ok {
				if n, ok := names[s]; ok {
					v[i] = n
				}
				continue
			}
			renameStrings(x, names)
		}
	}
}

// sortEnv sorts every container's env by name, in place.
func sortEnv(v any) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if env, ok := x.([]any); ok && k == "env" {
				sort.SliceStable(env, func(i, j int) bool {
					return fmt.Sprint(dig(env[i], "name")) < fmt.Sprint(dig(env[j], "name"))
				})
			}
			sortEnv(x)
		}
	case []any:
		for _, x := range v {
			sortEnv(x)
		}
	}
}

// diffTrees appends a line per difference between a (the chart's) and b
// (kustomize's), by path; list entries with a name are shown by name.
func diffTrees(path string, a, b any, out *[]string) {
	switch av := a.(type) {
	case map[string]any:
		bv, ok := b.(map[string]any)
		if !ok {
			break
		}
		keys := slices.Sorted(maps.Keys(av))
		for k := range bv {
			if _, ok := av[k]; !ok {
				keys = append(keys, k)
			}
		}
		for _, k := range keys {
			diffTrees(path+"."+k, av[k], bv[k], out)
		}
		return
	case []any:
		bv, ok := b.([]any)
		if !ok || len(av) != len(bv) {
			break
		}
		for i := range av {
			p := fmt.Sprintf("%s[%d]", path, i)
			for _, key := range []string{"name", "Name", "Alert"} {
				if n, ok := dig(av[i], key).(string); ok && n != "" {
					p = fmt.Sprintf("%s[%s]", path, n)
					break
				}
			}
			diffTrees(p, av[i], bv[i], out)
		}
		return
	}
	if !reflect.DeepEqual(a, b) {
		*out = append(*out, fmt.Sprintf("%s: chart %s, kustomize %s", path, jsonText(a), jsonText(b)))
	}
}

// jsonTree is v's JSON form, for diffTrees.
func jsonTree(t testing.TB, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func jsonText(v any) string {
	if v == nil {
		return "(none)"
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	if len(b) > 300 {
		return string(b[:300]) + "..."
	}
	return string(b)
}

// TestChartFilesCopied: the chart's copies of files outside it (a chart
// can read only its own files) are the originals, byte for byte.
func TestChartFilesCopied(t *testing.T) {
	for copied, orig := range map[string]string{
		filepath.Join(chartDir, "files", "alerts.yml"): filepath.Join("prometheus", "alerts.yml"),
		filepath.Join(chartDir, "files", "envoy.yaml"): filepath.Join(kubeDir, "gateway", "envoy.yaml"),
	} {
		a, err := os.ReadFile(copied)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(orig)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs from %s: cp %s %s", copied, orig, orig, copied)
		}
	}
}

// TestChartMonitoring renders the Prometheus Operator objects and checks
// them against what the Prometheus files hold: the PrometheusRule's groups
// are deploy/prometheus/alerts.yml's (parsed by Prometheus's own rule
// parser), and the monitors find the pods the manifests run and give
// their series the job and region that scrape.yml gives them, which the
// alerts and the dashboard use.
func TestChartMonitoring(t *testing.T) {
	values, ns := overlayValues(t, filepath.Join(kubeDir, "overlays", "eu-west-1"))
	values["monitoring"] = map[string]any{
		"prometheusRule": true, "serviceMonitor": true, "podMonitor": true,
		"labels": map[string]any{"release": "kube-prometheus-stack"},
	}
	r := chartRendering(t, "eu-west-1 with monitoring", values, ns)
	if t.Failed() {
		return
	}
	for _, o := range r.objs {
		switch o.(type) {
		case *monitoringv1.PrometheusRule, *monitoringv1.ServiceMonitor, *monitoringv1.PodMonitor:
			m, _ := meta.Accessor(o)
			if m.GetLabels()["release"] != "kube-prometheus-stack" {
				t.Errorf("%s %s: monitoring.labels not set: %v", kindOf(t, o), m.GetName(), m.GetLabels())
			}
		}
	}
	scrape := readScrapeConfig(t)

	// The alerts, as Prometheus would load them from the PrometheusRule.
	var rule *monitoringv1.PrometheusRule
	for _, o := range r.objs {
		if v, ok := o.(*monitoringv1.PrometheusRule); ok {
			rule = v
		}
	}
	if rule == nil {
		t.Fatal("no PrometheusRule")
	}
	b, err := yaml.Marshal(rule.Spec)
	if err != nil {
		t.Fatal(err)
	}
	got, errs := rulefmt.Parse(b, false, model.LegacyValidation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Errorf("PrometheusRule %s: %v", rule.Name, err)
	}
	want := readAlerts(t)
	if got == nil || len(got.Groups) == 0 {
		t.Fatal("PrometheusRule has no groups")
	}
	if !reflect.DeepEqual(got.Groups, want.Groups) {
		var diffs []string
		diffTrees("PrometheusRule "+rule.Name+" groups", jsonTree(t, got.Groups), jsonTree(t, want.Groups), &diffs)
		t.Errorf("PrometheusRule %s's groups differ from prometheus/alerts.yml (chart, then alerts.yml):\n%s", rule.Name, strings.Join(diffs, "\n"))
	}

	// Coordinators: the ServiceMonitor's Service, every member ready or
	// not, on the port the pods' scrape annotation names.
	sts := get[*appsv1.StatefulSet](r, "coordinator")
	var sm *monitoringv1.ServiceMonitor
	for _, o := range r.objs {
		if v, ok := o.(*monitoringv1.ServiceMonitor); ok {
			sm = v
		}
	}
	if sm == nil || sts == nil {
		t.Fatal("no ServiceMonitor or no StatefulSet coordinator")
	}
	c := sts.Spec.Template.Spec.Containers[0]
	var selected []*corev1.Service
	for _, svc := range all[*corev1.Service](r) {
		if selects(sm.Spec.Selector.MatchLabels, svc.Labels) {
			selected = append(selected, svc)
		}
	}
	if len(selected) != 1 {
		t.Fatalf("ServiceMonitor %s selects %d Services, want one (the others would scrape members twice, or not at all)", sm.Name, len(selected))
	}
	svc := selected[0]
	if !svc.Spec.PublishNotReadyAddresses || !selects(svc.Spec.Selector, sts.Spec.Template.Labels) {
		t.Errorf("Service %s: want every coordinator pod, unready ones too (publishNotReadyAddresses): a group without a leader must still be scraped", svc.Name)
	}
	if len(sm.Spec.Endpoints) != 1 {
		t.Fatalf("ServiceMonitor %s: want one endpoint, have %d", sm.Name, len(sm.Spec.Endpoints))
	}
	ep := sm.Spec.Endpoints[0]
	port := -1
	for _, p := range svc.Spec.Ports {
		if p.Name == ep.Port {
			port = containerPort(c, p.TargetPort)
		}
	}
	if ann := sts.Spec.Template.Annotations["prometheus.io/port"]; strconv.Itoa(port) != ann || ep.Path != sts.Spec.Template.Annotations["prometheus.io/path"] {
		t.Errorf("ServiceMonitor %s scrapes port %d path %q; the pods' scrape annotations say %s %s", sm.Name, port, ep.Path, ann, sts.Spec.Template.Annotations["prometheus.io/path"])
	}
	checkRelabel(t, "ServiceMonitor "+sm.Name, ep.RelabelConfigs, sts.Spec.Template.Labels, "ration-coordinator", scrape)

	// Agents: the PodMonitor finds the gateway pods by label and scrapes the
	// agent's HTTP port.
	dep := get[*appsv1.Deployment](r, "gateway")
	var pm *monitoringv1.PodMonitor
	for _, o := range r.objs {
		if v, ok := o.(*monitoringv1.PodMonitor); ok {
			pm = v
		}
	}
	if pm == nil || dep == nil {
		t.Fatal("no PodMonitor or no Deployment gateway")
	}
	tpl := dep.Spec.Template
	if !selects(pm.Spec.Selector.MatchLabels, tpl.Labels) {
		t.Errorf("PodMonitor %s selects %v, not the gateway pods %v", pm.Name, pm.Spec.Selector.MatchLabels, tpl.Labels)
	}
	if len(pm.Spec.PodMetricsEndpoints) != 1 || pm.Spec.PodMetricsEndpoints[0].Port == nil {
		t.Fatalf("PodMonitor %s: want one endpoint with a port name", pm.Name)
	}
	pep := pm.Spec.PodMetricsEndpoints[0]
	var agent corev1.Container
	for _, ic := range tpl.Spec.InitContainers {
		if ic.Name == "gateway-agent" {
			agent = ic
		}
	}
	if ann := tpl.Annotations["prometheus.io/port"]; strconv.Itoa(containerPort(agent, intstr.FromString(*pep.Port))) != ann || pep.Path != tpl.Annotations["prometheus.io/path"] {
		t.Errorf("PodMonitor %s scrapes port %s path %q; the pods' scrape annotations say %s %s", pm.Name, *pep.Port, pep.Path, ann, tpl.Annotations["prometheus.io/path"])
	}
	checkRelabel(t, "PodMonitor "+pm.Name, pep.RelabelConfigs, tpl.Labels, "ration-agent", scrape)
	if len(pm.Spec.NamespaceSelector.MatchNames) != 0 || pm.Spec.NamespaceSelector.Any {
		t.Errorf("PodMonitor %s: namespaceSelector %+v, want the release's namespace by default", pm.Name, pm.Spec.NamespaceSelector)
	}

	// Gateways in other namespaces.
	values["monitoring"].(map[string]any)["agentNamespaces"] = []any{"gateways", "edge"}
	r = chartRendering(t, "eu-west-1 with agents elsewhere", values, ns)
	for _, o := range r.objs {
		if v, ok := o.(*monitoringv1.PodMonitor); ok && !slices.Equal(v.Spec.NamespaceSelector.MatchNames, []string{"gateways", "edge"}) {
			t.Errorf("PodMonitor %s: namespaceSelector %+v, want matchNames [gateways edge]", v.Name, v.Spec.NamespaceSelector)
		}
	}
}

// checkRelabel applies the monitor's relabelings (action replace, the
// only one it should need) to a target of a pod with podLabels, as
// Prometheus does after the operator's own, and checks the job and region
// the series get: the ones scrape.yml gives them.
func checkRelabel(t *testing.T, what string, rcs []monitoringv1.RelabelConfig, podLabels map[string]string, job string, scrape scrapeLabels) {
	t.Helper()
	lbls := map[string]string{"job": "set-by-the-operator"}
	sanitize := regexp.MustCompile(`[^a-zA-Z0-9_]`)
	for k, v := range podLabels {
		lbls["__meta_kubernetes_pod_label_"+sanitize.ReplaceAllString(k, "_")] = v
	}
	for _, rc := range rcs {
		if rc.Action != "" && !strings.EqualFold(rc.Action, "replace") {
			t.Errorf("%s: relabeling action %s: only replace is simulated here", what, rc.Action)
			continue
		}
		var vals []string
		for _, s := range rc.SourceLabels {
			vals = append(vals, lbls[string(s)])
		}
		sep, regex, repl := ";", "(.*)", "$1"
		if rc.Separator != nil {
			sep = *rc.Separator
		}
		if rc.Regex != "" {
			regex = rc.Regex
		}
		if rc.Replacement != nil {
			repl = *rc.Replacement
		}
		re := regexp.MustCompile("^(?:" + regex + ")$")
		src := strings.Join(vals, sep)
		m := re.FindStringSubmatchIndex(src)
		if m == nil {
			continue
		}
		res := string(re.ExpandString(nil, repl, src, m))
		if res == "" {
			delete(lbls, rc.TargetLabel)
		} else {
			lbls[rc.TargetLabel] = res
		}
	}
	if lbls["job"] != job || !scrape.jobs[job] {
		t.Errorf("%s: series get job %q, want %q (scrape.yml's jobs: %v)", what, lbls["job"], job, sortedKeys(scrape.jobs))
	}
	if lbls["region"] == "" || lbls["region"] != podLabels["ration.dev/region"] {
		t.Errorf("%s: series get region %q, the pods are labelled ration.dev/region %q", what, lbls["region"], podLabels["ration.dev/region"])
	}
}

// standaloneValues is the least one can install: a region and its rules,
// no global group.
func standaloneValues(t testing.TB) map[string]any {
	t.Helper()
	rules, err := os.ReadFile(filepath.Join(repoRoot, "examples", "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return map[string]any{"region": "eu-west-1", "rules": string(rules), "agent": map[string]any{"redis": "redis:6379"}}
}

// TestChartConfigAccepted does for the chart what TestManifestConfigAccepted
// does for the overlays: every RATION_* variable it sets is one the
// binaries read, with a value they accept (coordinator -validate for every
// member, and as coordinator-0 bootstraps; the agent starts), for each
// example and for the chart's defaults with only a region and rules.
func TestChartConfigAccepted(t *testing.T) {
	agentCLI, coordCLI := help(t, "gateway-agent"), help(t, "coordinator")
	type install struct {
		what   string
		values map[string]any
		ns     string
	}
	var installs []install
	for _, dir := range overlays(t) {
		v, ns := overlayValues(t, dir)
		installs = append(installs, install{filepath.Base(dir), v, ns})
	}
	installs = append(installs, install{"defaults", standaloneValues(t), "ration"})
	for _, in := range installs {
		t.Run(in.what, func(t *testing.T) {
			r := chartRendering(t, in.what, in.values, in.ns)
			rules := in.values["rules"].(string)
			for _, sts := range all[*appsv1.StatefulSet](r) {
				c := sts.Spec.Template.Spec.Containers[0]
				for i := range int(*sts.Spec.Replicas) {
					e := coordinatorEnv(t, r, i)
					where := fmt.Sprintf("%s %s-%d", in.what, sts.Name, i)
					checkNames(t, where, coordCLI, e, c.Args, []string{"POD_NAME", "POD_NAMESPACE"})
					if i == 0 {
						boot := map[string]string{"RATION_BOOTSTRAP": "true"}
						for k, v := range e {
							if k != "RATION_JOIN" {
								boot[k] = v
							}
						}
						runCoordinatorValidate(t, where+" (bootstrap)", boot, rules, c.Args...)
					}
					runCoordinatorValidate(t, where, e, rules, c.Args...)
				}
			}
			for _, dep := range all[*appsv1.Deployment](r) {
				for _, c := range dep.Spec.Template.Spec.InitContainers {
					if c.Name != "gateway-agent" {
						continue
					}
					e := env(t, c, map[string]string{"metadata.name": dep.Name + "-abc12-xyz34", "metadata.namespace": dep.Namespace})
					where := in.what + " " + dep.Name + "/" + c.Name
					checkNames(t, where, agentCLI, e, c.Args, []string{"POD_NAME"})
					startAgent(t, where, e, rules, c.Args...)
				}
			}
		})
	}
}

// TestChartDefaults: the chart's defaults with only a region and rules
// make a region with a group of its own (no upstream; the coordinators
// and the agents name the same region, so that `coordinator tune -region`
// reaches the agents' leases), with the example gateway, and pass the
// kustomize tests' gateway and NetworkPolicy checks; no Prometheus
// Operator object unless asked for. (checkCoordinator is not run: it
// takes a group without upstream for the global group, the only such
// group the overlays have. TestChartConfigAccepted has the coordinator
// accept these variables.)
func TestChartDefaults(t *testing.T) {
	r := chartRendering(t, "defaults", standaloneValues(t), "ration")
	rr := withNamespace(r, "ration")
	checkGateway(t, rr)
	checkNetworkPolicies(t, rr)
	e := coordinatorEnv(t, rr, 0)
	if e["RATION_UPSTREAM"] != "" || e["RATION_REGION"] != "eu-west-1" {
		t.Errorf("defaults: RATION_UPSTREAM %q, RATION_REGION %q: want no upstream, and the region", e["RATION_UPSTREAM"], e["RATION_REGION"])
	}
	for _, o := range r.objs {
		if strings.HasPrefix(reflect.TypeOf(o).Elem().PkgPath(), "github.com/prometheus-operator/") {
			t.Errorf("defaults render %s %s: the Prometheus Operator's CRDs may not be installed", kindOf(t, o), objName(t, o))
		}
	}
	sts := get[*appsv1.StatefulSet](r, "coordinator")
	if img := sts.Spec.Template.Spec.Containers[0].Image; img != "ration/coordinator:"+loadChart(t).Metadata.AppVersion {
		t.Errorf("default coordinator image %s: want ration/coordinator at the chart's appVersion", img)
	}
}

// TestChartValues: values other than the defaults land where they should,
// and values that would make a broken group are refused when rendering
// (by the template or by values.schema.json), with a message that says
// which.
func TestChartValues(t *testing.T) {
	set := func(v map[string]any, path string, x any) {
		parts := strings.Split(path, ".")
		for _, p := range parts[:len(parts)-1] {
			next, ok := v[p].(map[string]any)
			if !ok {
				next = map[string]any{}
				v[p] = next
			}
			v = next
		}
		v[parts[len(parts)-1]] = x
	}

	t.Run("replicas", func(t *testing.T) {
		v := standaloneValues(t)
		set(v, "coordinator.replicas", 5)
		set(v, "coordinator.updateStrategy", "OnDelete")
		r := chartRendering(t, "replicas 5", v, "ration")
		sts := get[*appsv1.StatefulSet](r, "coordinator")
		if *sts.Spec.Replicas != 5 || sts.Spec.UpdateStrategy.Type != appsv1.OnDeleteStatefulSetStrategyType {
			t.Errorf("replicas %d, updateStrategy %v: want 5, OnDelete", *sts.Spec.Replicas, sts.Spec.UpdateStrategy)
		}
		for i := range 5 {
			pod := fmt.Sprintf("coordinator-%d", i)
			e := coordinatorEnv(t, r, i)
			if svc := serviceFor(t, r, pod+" RATION_RAFT_ADVERTISE", e["RATION_RAFT_ADVERTISE"], "ration"); svc != nil && svc.Name != pod {
				t.Errorf("%s advertises Service %s", pod, svc.Name)
			}
		}
		if get[*corev1.Service](r, "coordinator-5") != nil {
			t.Error("a Service for coordinator-5, which does not exist")
		}
		pdb := get[*policyv1.PodDisruptionBudget](r, "coordinator")
		if pdb.Spec.MaxUnavailable.IntValue() != 2 {
			t.Errorf("PodDisruptionBudget maxUnavailable %v, want 2 of 5", pdb.Spec.MaxUnavailable)
		}
	})

	t.Run("images and resources", func(t *testing.T) {
		v := standaloneValues(t)
		set(v, "images.registry", "registry.example.com/team/")
		set(v, "images.coordinator.tag", "1.2.3")
		set(v, "images.gatewayAgent.tag", "1.2.4")
		set(v, "images.pullPolicy", "Always")
		set(v, "images.pullSecrets", []any{"regcred"})
		set(v, "coordinator.resources", map[string]any{"requests": map[string]any{"cpu": "1", "memory": "1Gi"}, "limits": map[string]any{"memory": "2Gi"}})
		set(v, "agent.resources.requests.cpu", "500m")
		set(v, "coordinator.storage", map[string]any{"size": "10Gi", "storageClassName": "fast"})
		set(v, "coordinator.nodeSelector", map[string]any{"pool": "ration"})
		r := chartRendering(t, "images", v, "ration")
		sts := get[*appsv1.StatefulSet](r, "coordinator")
		dep := get[*appsv1.Deployment](r, "gateway")
		c := sts.Spec.Template.Spec.Containers[0]
		agent, envoy := dep.Spec.Template.Spec.InitContainers[0], dep.Spec.Template.Spec.Containers[0]
		for img, want := range map[string]string{
			c.Image:     "registry.example.com/team/ration/coordinator:1.2.3",
			agent.Image: "registry.example.com/team/ration/gateway-agent:1.2.4",
			envoy.Image: "envoyproxy/envoy:distroless-v1.35.3",
		} {
			if img != want {
				t.Errorf("image %s, want %s", img, want)
			}
		}
		for _, x := range []corev1.Container{c, agent, envoy} {
			if x.ImagePullPolicy != corev1.PullAlways {
				t.Errorf("container %s: imagePullPolicy %q, want Always", x.Name, x.ImagePullPolicy)
			}
		}
		for _, spec := range []corev1.PodSpec{sts.Spec.Template.Spec, dep.Spec.Template.Spec} {
			if len(spec.ImagePullSecrets) != 1 || spec.ImagePullSecrets[0].Name != "regcred" {
				t.Errorf("imagePullSecrets %v, want regcred", spec.ImagePullSecrets)
			}
		}
		if c.Resources.Requests.Cpu().String() != "1" || c.Resources.Limits.Memory().String() != "2Gi" {
			t.Errorf("coordinator resources %v", c.Resources)
		}
		if agent.Resources.Requests.Cpu().String() != "500m" || agent.Resources.Limits.Memory().String() != "256Mi" {
			t.Errorf("agent resources %v: want the cpu request set and the memory limit kept", agent.Resources)
		}
		vct := sts.Spec.VolumeClaimTemplates[0].Spec
		if vct.StorageClassName == nil || *vct.StorageClassName != "fast" || vct.Resources.Requests.Storage().String() != "10Gi" {
			t.Errorf("volumeClaimTemplate %+v", vct)
		}
		if sts.Spec.Template.Spec.NodeSelector["pool"] != "ration" {
			t.Errorf("nodeSelector %v", sts.Spec.Template.Spec.NodeSelector)
		}
	})

	t.Run("extraEnv", func(t *testing.T) {
		v := standaloneValues(t)
		set(v, "coordinator.extraEnv", []any{map[string]any{"name": "RATION_UPSTREAM_RENEW_AT", "value": "0.6"}})
		set(v, "agent.extraEnv", []any{map[string]any{"name": "REDIS_PASSWORD", "value": "s3cret"}})
		set(v, "agent.redis", "redis://:$(REDIS_PASSWORD)@redis:6379")
		r := chartRendering(t, "extraEnv", v, "ration")
		if e := coordinatorEnv(t, r, 0); e["RATION_UPSTREAM_RENEW_AT"] != "0.6" {
			t.Errorf("coordinator RATION_UPSTREAM_RENEW_AT %q", e["RATION_UPSTREAM_RENEW_AT"])
		}
		dep := get[*appsv1.Deployment](r, "gateway")
		e := env(t, dep.Spec.Template.Spec.InitContainers[0], map[string]string{"metadata.name": "gateway-x"})
		if e["RATION_REDIS"] != "redis://:s3cret@redis:6379" {
			t.Errorf("RATION_REDIS %q: want $(REDIS_PASSWORD) expanded", e["RATION_REDIS"])
		}
	})

	t.Run("kubeVersion", func(t *testing.T) {
		kv := loadChart(t).Metadata.KubeVersion
		if !chartutil.IsCompatibleRange(kv, "1.29.0") || chartutil.IsCompatibleRange(kv, "1.28.9") {
			t.Errorf("Chart.yaml kubeVersion %q: want 1.29 or later (native sidecars)", kv)
		}
	})

	type kv = map[string]any
	for _, tc := range []struct {
		what string
		set  kv     // path -> value, on top of standaloneValues
		want string // in the error
	}{
		{"no region", kv{"region": ""}, "region is required"},
		{"bad region", kv{"region": "EU"}, "/region"},
		{"agents in the global group", kv{"region": "global"}, "the global group serves no agents"},
		{"upstream of the global group", kv{"region": "global", "gateway.enabled": false, "coordinator.upstream": []any{"g:8301"}}, "the global group has no upstream"},
		{"bad upstream", kv{"coordinator.upstream": "g1:8301,g2:8301"}, "/coordinator/upstream"},
		{"no rules", kv{"rules": ""}, "rules is required"},
		{"no replicas", kv{"coordinator.replicas": 0}, "/coordinator/replicas"},
		{"bad update strategy", kv{"coordinator.updateStrategy": "Recreate"}, "/coordinator/updateStrategy"},
		{"unknown value", kv{"coordinator.replica": 3}, "additional properties 'replica' not allowed"},
		{"bad duration", kv{"coordinator.tick": "half a second"}, "/coordinator/tick"},
		{"bad log level", kv{"agent.logLevel": "verbose"}, "/agent/logLevel"},
		{"chart's variable in extraEnv", kv{"coordinator.extraEnv": []any{kv{"name": "RATION_TICK", "value": "1s"}}}, "RATION_TICK is set by the chart"},
		{"agent variable in extraEnv", kv{"agent.extraEnv": []any{kv{"name": "RATION_REDIS", "value": "x:1"}}}, "RATION_REDIS is set by the chart"},
		{"external without domain", kv{"coordinator.external": kv{"enabled": true, "sourceRanges": []any{"203.0.113.0/24"}}}, "coordinator.external.domain is required"},
		{"external open to all", kv{"coordinator.external": kv{"enabled": true, "domain": "g.example.com"}}, "sourceRanges is required"},
	} {
		t.Run(tc.what, func(t *testing.T) {
			v := standaloneValues(t)
			for path, x := range tc.set {
				set(v, path, x)
			}
			_, err := renderChart(t, v, "ration")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v: rendering error %v, want one mentioning %q", tc.set, err, tc.want)
			}
		})
	}
}

// TestChartLint runs Helm's linter (`helm lint --strict`: Chart.yaml,
// values against the schema, every template rendered and parsed) with each
// example's values; warnings fail.
func TestChartLint(t *testing.T) {
	for _, dir := range overlays(t) {
		values, ns := overlayValues(t, dir)
		l := lint.All(chartDir, values, ns, true)
		for _, m := range l.Messages {
			if m.Severity >= support.WarningSev {
				t.Errorf("helm lint with %s's values: %s", filepath.Base(dir), m)
			} else {
				t.Logf("helm lint with %s's values: %s", filepath.Base(dir), m)
			}
		}
	}
}

// TestOverlayImages: every overlay names the images it runs with
// `images:` (the issue asks for it), pointing at a registry and at the
// chart's appVersion, as the chart's examples do; every Ration image its
// rendering runs is covered.
func TestOverlayImages(t *testing.T) {
	appVersion := loadChart(t).Metadata.AppVersion
	for _, dir := range overlays(t) {
		k := readKustomization(t, dir)
		set := map[string]string{}
		for _, img := range k.Images {
			if img.NewName == "" || img.NewTag == "" || img.Digest != "" {
				t.Errorf("%s: images: %s: want newName (your registry) and newTag", dir, img.Name)
			}
			if !strings.HasSuffix(img.NewName, "/"+img.Name) {
				t.Errorf("%s: images: %s renamed %s: want REGISTRY/%s, as deploy/README.md builds it", dir, img.Name, img.NewName, img.Name)
			}
			if img.NewTag != appVersion {
				t.Errorf("%s: images: %s tag %s, want the chart's appVersion %s (the version both deploy)", dir, img.Name, img.NewTag, appVersion)
			}
			set[img.NewName+":"+img.NewTag] = img.Name
		}
		r := render(t, dir)
		var images []string
		for _, sts := range all[*appsv1.StatefulSet](r) {
			for _, c := range sts.Spec.Template.Spec.Containers {
				images = append(images, c.Image)
			}
		}
		for _, d := range all[*appsv1.Deployment](r) {
			for _, c := range d.Spec.Template.Spec.InitContainers {
				images = append(images, c.Image)
			}
		}
		for _, img := range images {
			if _, ok := set[img]; !ok {
				t.Errorf("%s: image %s is not set by the overlay's images: (have %v)", dir, img, sortedKeys(set))
			}
		}
	}
}

// TestChartValuesDocumented: values.yaml, values.schema.json and the
// table of docs/operations.md ("Installing with Helm") name the same
// values, so that none is undocumented or unchecked.
func TestChartValuesDocumented(t *testing.T) {
	// Maps whose keys are the user's own are values as a whole.
	freeForm := map[string]bool{"resources": true, "nodeSelector": true, "annotations": true, "labels": true}
	var walk func(prefix string, v map[string]any, out map[string]bool)
	walk = func(prefix string, v map[string]any, out map[string]bool) {
		for k, x := range v {
			p := prefix + k
			if m, ok := x.(map[string]any); ok && !freeForm[k] {
				walk(p+".", m, out)
				continue
			}
			out[p] = true
		}
	}
	values := map[string]bool{}
	walk("", readValues(t, filepath.Join(chartDir, "values.yaml")), values)

	b, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	var props func(prefix string, s map[string]any, out map[string]bool)
	props = func(prefix string, s map[string]any, out map[string]bool) {
		ps, _ := s["properties"].(map[string]any)
		for k, x := range ps {
			sub, _ := x.(map[string]any)
			if _, nested := sub["properties"]; nested && !freeForm[k] {
				if sub["additionalProperties"] != false {
					t.Errorf("values.schema.json: %s%s allows keys it does not name: a typo would pass", prefix, k)
				}
				props(prefix+k+".", sub, out)
				continue
			}
			out[prefix+k] = true
		}
	}
	inSchema := map[string]bool{}
	props("", schema, inSchema)
	if schema["additionalProperties"] != false {
		t.Error("values.schema.json allows top-level keys it does not name")
	}
	delete(inSchema, "global") // Helm's, for a parent chart

	doc, err := os.ReadFile(filepath.Join(repoRoot, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## Installing with Helm\n")
	if !ok {
		t.Fatal(`docs/operations.md has no section "## Installing with Helm"`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var table strings.Builder
	for _, l := range strings.Split(section, "\n") {
		if strings.HasPrefix(l, "| ") {
			table.WriteString(l + "\n")
		}
	}
	for _, p := range sortedKeys(values) {
		if !inSchema[p] {
			t.Errorf("value %s is not in values.schema.json", p)
		}
		if !strings.Contains(table.String(), "`"+p+"`") {
			t.Errorf("value %s is not in docs/operations.md's table (\"Installing with Helm\")", p)
		}
	}
	for _, p := range sortedKeys(inSchema) {
		if !values[p] {
			t.Errorf("values.schema.json names %s, which values.yaml does not have", p)
		}
	}
	if len(values) < 30 {
		t.Errorf("read %d values from values.yaml: the walk is not reading them", len(values))
	}
}
