package deploy

import (
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

// scrapeLabels is what deploy/prometheus/scrape.yml adds to every series:
// the target labels it sets (plus Prometheus's own instance), and the
// values it gives job.
type scrapeLabels struct {
	target map[string]bool
	jobs   map[string]bool
}

func readScrapeConfig(t testing.TB) scrapeLabels {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("prometheus", "scrape.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		ScrapeConfigs []struct {
			JobName        string `json:"job_name"`
			RelabelConfigs []struct {
				SourceLabels []string `json:"source_labels"`
				Regex        string   `json:"regex"`
				Replacement  string   `json:"replacement"`
				TargetLabel  string   `json:"target_label"`
				Action       string   `json:"action"`
			} `json:"relabel_configs"`
			StaticConfigs []struct {
				Targets []string          `json:"targets"`
				Labels  map[string]string `json:"labels"`
			} `json:"static_configs"`
			KubernetesSDConfigs []struct {
				Role string `json:"role"`
			} `json:"kubernetes_sd_configs"`
		} `json:"scrape_configs"`
	}
	if err := yaml.UnmarshalStrict(b, &cfg); err != nil {
		t.Fatalf("prometheus/scrape.yml: %v", err)
	}
	if tt, ok := t.(*testing.T); ok {
		var raw any
		if err := yaml.Unmarshal(b, &raw); err != nil {
			t.Fatal(err)
		}
		checkKeyCase(tt, "prometheus/scrape.yml", raw, reflect.TypeOf(cfg))
	}
	s := scrapeLabels{target: map[string]bool{"instance": true, "job": true}, jobs: map[string]bool{}}
	for _, sc := range cfg.ScrapeConfigs {
		setsJob := false
		var components []string
		for _, rc := range sc.RelabelConfigs {
			if rc.Action == "keep" && slices.Equal(rc.SourceLabels, []string{"__meta_kubernetes_pod_label_ration_dev_component"}) {
				components = strings.Split(rc.Regex, "|")
			}
			if rc.TargetLabel != "" && !strings.HasPrefix(rc.TargetLabel, "__") {
				s.target[rc.TargetLabel] = true
			}
			if rc.TargetLabel == "job" {
				setsJob = true
				for _, c := range components {
					s.jobs[strings.ReplaceAll(rc.Replacement, "$1", c)] = true
				}
			}
		}
		if !setsJob {
			s.jobs[sc.JobName] = true
		}
		for _, st := range sc.StaticConfigs {
			for k := range st.Labels {
				s.target[k] = true
			}
		}
	}
	return s
}

// TestScrapeConfig checks scrape.yml against the manifests: the pods it
// keeps are the ones the manifests label, it gives every series a region,
// and the job names are the ones the alerts use.
func TestScrapeConfig(t *testing.T) {
	s := readScrapeConfig(t)
	for _, l := range []string{"region", "job", "instance"} {
		if !s.target[l] {
			t.Errorf("scrape.yml does not set %q on the series", l)
		}
	}
	for _, j := range []string{"ration-agent", "ration-coordinator"} {
		if !s.jobs[j] {
			t.Errorf("scrape.yml gives no target job %q (jobs: %v)", j, sortedKeys(s.jobs))
		}
	}
	b, _ := os.ReadFile(filepath.Join("prometheus", "scrape.yml"))
	for _, want := range []string{
		"__meta_kubernetes_pod_label_ration_dev_component", // ration.dev/component
		"__meta_kubernetes_pod_label_ration_dev_region",    // ration.dev/region
		"__meta_kubernetes_pod_annotation_prometheus_io_scrape",
		"__meta_kubernetes_pod_annotation_prometheus_io_port",
		"__meta_kubernetes_pod_annotation_prometheus_io_path",
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("scrape.yml does not use %s, which the manifests' pod labels and annotations are made for", want)
		}
	}
}

var (
	sourceOnce    sync.Once
	sourceStrings map[string]bool
)

// inSource reports whether s is a Go string literal somewhere in the
// binaries' non-test sources: label values the test traffic did not
// produce (a store timeout, say) must at least be words the code uses.
func inSource(t testing.TB, s string) bool {
	sourceOnce.Do(func() {
		sourceStrings = map[string]bool{}
		lit := regexp.MustCompile(`"((?:[^"\\\n]|\\.)*)"`)
		for _, dir := range []string{"internal", "cmd"} {
			filepath.WalkDir(filepath.Join(repoRoot, dir), func(p string, d fs.DirEntry, err error) error {
				if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
					return err
				}
				b, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				for _, m := range lit.FindAllStringSubmatch(string(b), -1) {
					if v, err := strconv.Unquote(`"` + m[1] + `"`); err == nil {
						sourceStrings[v] = true
					}
				}
				return nil
			})
		}
	})
	return sourceStrings[s]
}

// promChecker checks PromQL expressions against the exported metrics.
type promChecker struct {
	ex     exported
	scrape scrapeLabels
	parser parser.Parser
	used   map[string]bool // metric families referenced, over all checks
}

func newPromChecker(t *testing.T) *promChecker {
	return &promChecker{ex: exportedMetrics(t), scrape: readScrapeConfig(t), parser: parser.NewParser(parser.Options{}), used: map[string]bool{}}
}

// resolve maps a series name to its family: X, or X_bucket/_sum/_count
// of a histogram or summary X.
func (c *promChecker) resolve(name string) (string, *family) {
	if f := c.ex[name]; f != nil {
		return name, f
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suf)
		if !ok {
			continue
		}
		if f := c.ex[base]; f != nil && (f.typ == dto.MetricType_HISTOGRAM || suf != "_bucket" && f.typ == dto.MetricType_SUMMARY) {
			return base, f
		}
	}
	return "", nil
}

var literalAlternation = regexp.MustCompile(`^[A-Za-z0-9_.:-]+(\|[A-Za-z0-9_.:-]+)*$`)

// check parses expr and reports every metric, label and label value it
// names that the binaries do not export. vars are Grafana variables,
// already substituted by the caller; their matchers are not checked by
// value.
func (c *promChecker) check(t *testing.T, where, expr string) {
	t.Helper()
	node, err := c.parser.ParseExpr(expr)
	if err != nil {
		t.Errorf("%s: %q does not parse: %v", where, expr, err)
		return
	}
	exprLabels := map[string]bool{}
	var grouping []string
	hasBucket := false
	selectors := 0
	parser.Inspect(node, func(n parser.Node, _ []parser.Node) error {
		switch v := n.(type) {
		case *parser.VectorSelector:
			selectors++
			name := v.Name
			for _, m := range v.LabelMatchers {
				if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
					name = m.Value
				}
			}
			if name == "" {
				t.Errorf("%s: a selector without a metric name in %q", where, expr)
				return nil
			}
			if name == "up" {
				// Prometheus's own series per target: only job and target labels.
				for _, m := range v.LabelMatchers {
					if m.Name == "job" && !c.scrape.jobs[m.Value] {
						t.Errorf("%s: up{job=%q}: scrape.yml has no such job (%v)", where, m.Value, sortedKeys(c.scrape.jobs))
					}
				}
				for l := range c.scrape.target {
					exprLabels[l] = true
				}
				return nil
			}
			fam, f := c.resolve(name)
			if f == nil {
				t.Errorf("%s: metric %s is not exported by gateway-agent or coordinator", where, name)
				return nil
			}
			c.used[fam] = true
			hasBucket = hasBucket || strings.HasSuffix(name, "_bucket")
			for l := range f.labels {
				exprLabels[l] = true
			}
			for l := range c.scrape.target {
				exprLabels[l] = true
			}
			for _, m := range v.LabelMatchers {
				if m.Name == labels.MetricName {
					continue
				}
				if c.scrape.target[m.Name] {
					continue
				}
				if m.Name == "le" && strings.HasSuffix(name, "_bucket") {
					continue
				}
				vals, ok := f.labels[m.Name]
				if !ok {
					t.Errorf("%s: %s has no label %q (it has %v)", where, name, m.Name, sortedKeys(f.labels))
					continue
				}
				var want []string
				switch {
				case m.Type == labels.MatchEqual || m.Type == labels.MatchNotEqual:
					want = []string{m.Value}
				case literalAlternation.MatchString(m.Value):
					want = strings.Split(m.Value, "|")
				}
				for _, w := range want {
					if w != "" && !vals[w] && !inSource(t, w) {
						t.Errorf("%s: %s{%s=%q}: no such value exported or in the code (seen: %v)", where, name, m.Name, w, sortedKeys(vals))
					}
				}
			}
		case *parser.AggregateExpr:
			grouping = append(grouping, v.Grouping...)
		case *parser.BinaryExpr:
			if v.VectorMatching != nil {
				grouping = append(grouping, v.VectorMatching.MatchingLabels...)
				grouping = append(grouping, v.VectorMatching.Include...)
			}
		}
		return nil
	})
	if selectors == 0 {
		t.Errorf("%s: %q selects no series", where, expr)
	}
	for _, g := range grouping {
		if !exprLabels[g] && !(g == "le" && hasBucket) {
			t.Errorf("%s: groups by %q, which no series of %q has", where, g, expr)
		}
	}
}
