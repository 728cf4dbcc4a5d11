package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// The subset of Grafana's dashboard model the dashboard uses. Decoding is
// strict: a field not listed here is an error, so a misspelt field cannot
// hide.
type dashboard struct {
	UID           string   `json:"uid"`
	Title         string   `json:"title"`
	Description   string   `json:"description"`
	Tags          []string `json:"tags"`
	Timezone      string   `json:"timezone"`
	Editable      bool     `json:"editable"`
	SchemaVersion int      `json:"schemaVersion"`
	Version       int      `json:"version"`
	Refresh       string   `json:"refresh"`
	Time          struct {
		From string `json:"from"`
		To   string `json:"to"`
	} `json:"time"`
	Templating struct {
		List []templateVar `json:"list"`
	} `json:"templating"`
	Annotations struct {
		List []json.RawMessage `json:"list"`
	} `json:"annotations"`
	Links []struct {
		Title string `json:"title"`
		Type  string `json:"type"`
		URL   string `json:"url"`
	} `json:"links"`
	Panels []panel `json:"panels"`
}

type templateVar struct {
	Name       string          `json:"name"`
	Label      string          `json:"label"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"`
	Definition string          `json:"definition"`
	Datasource *datasource     `json:"datasource"`
	Refresh    int             `json:"refresh"`
	Multi      bool            `json:"multi"`
	IncludeAll bool            `json:"includeAll"`
	AllValue   string          `json:"allValue"`
	Current    json.RawMessage `json:"current"`
	Sort       int             `json:"sort"`
	Hide       int             `json:"hide"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	ID          int         `json:"id"`
	Type        string      `json:"type"`
	Title       string      `json:"title"`
	Description string      `json:"description"`
	Collapsed   bool        `json:"collapsed"`
	Datasource  *datasource `json:"datasource"`
	GridPos     struct {
		X int `json:"x"`
		Y int `json:"y"`
		W int `json:"w"`
		H int `json:"h"`
	} `json:"gridPos"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
		Overrides []json.RawMessage `json:"overrides"`
	} `json:"fieldConfig"`
	Options json.RawMessage `json:"options"`
	Panels  []panel         `json:"panels"`
	Targets []struct {
		RefID        string      `json:"refId"`
		Expr         string      `json:"expr"`
		LegendFormat string      `json:"legendFormat"`
		Datasource   *datasource `json:"datasource"`
	} `json:"targets"`
}

// grafanaVar matches $name, ${name} and ${name:format}.
var grafanaVar = regexp.MustCompile(`\$(?:\{([A-Za-z0-9_]+)(?::[a-z]+)?\}|([A-Za-z0-9_]+))`)

// TestDashboard decodes the dashboard strictly, checks its layout and
// variables, and checks every query against the exported metrics; and it
// holds the dashboard to the list: decisions by result and path,
// latency p50/p99, fallback activations, the overshoot bound, lease pool
// and shares per quota and region, Raft leader changes and apply latency.
func TestDashboard(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("grafana", "ration.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("grafana/ration.json: %v", err)
	}
	// encoding/json matches field names case-insensitively; Grafana does
	// not. Check the case of every key against the model above.
	var raw any
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	checkKeyCase(t, "dashboard", raw, reflect.TypeOf(d))
	if d.UID == "" || d.Title == "" || d.SchemaVersion < 36 {
		t.Errorf("uid %q, title %q, schemaVersion %d: want both set and a current schema", d.UID, d.Title, d.SchemaVersion)
	}

	vars := map[string]templateVar{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	if v, ok := vars["datasource"]; !ok || v.Type != "datasource" || string(v.Query) != `"prometheus"` {
		t.Error(`want a "datasource" variable of type datasource for Prometheus, so the dashboard imports anywhere`)
	}
	c := newPromChecker(t)
	// Grafana's built-in variables, as Prometheus will see them.
	builtin := map[string]string{"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}
	substitute := func(where, s string) string {
		return grafanaVar.ReplaceAllStringFunc(s, func(m string) string {
			sm := grafanaVar.FindStringSubmatch(m)
			name := sm[1] + sm[2]
			if v, ok := builtin[name]; ok {
				return v
			}
			v, ok := vars[name]
			if !ok {
				t.Errorf("%s: variable $%s is not defined in templating", where, name)
				return ".*"
			}
			if v.AllValue != "" {
				return v.AllValue
			}
			return ".*"
		})
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct{ Query string }
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Errorf("variable %s: query: %v", v.Name, err)
			continue
		}
		m := regexp.MustCompile(`^label_values\((\w+),\s*(\w+)\)$`).FindStringSubmatch(q.Query)
		if m == nil {
			t.Errorf("variable %s: query %q: want label_values(metric, label)", v.Name, q.Query)
			continue
		}
		if f := c.ex[m[1]]; f == nil {
			t.Errorf("variable %s: metric %s is not exported", v.Name, m[1])
		} else if _, ok := f.labels[m[2]]; !ok && !c.scrape.target[m[2]] {
			t.Errorf("variable %s: %s has no label %s", v.Name, m[1], m[2])
		}
		checkDatasource(t, "variable "+v.Name, v.Datasource)
	}

	// Layout: unique ids, inside the 24-column grid, no overlaps.
	ids := map[int]bool{}
	var boxes []panel
	var flat []panel
	for _, p := range d.Panels {
		flat = append(flat, p)
		flat = append(flat, p.Panels...)
	}
	for _, p := range flat {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		g := p.GridPos
		if g.X < 0 || g.W <= 0 || g.H <= 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v outside the 24-column grid", p.Title, g)
		}
		for _, q := range boxes {
			h := q.GridPos
			if g.X < h.X+h.W && h.X < g.X+g.W && g.Y < h.Y+h.H && h.Y < g.Y+g.H {
				t.Errorf("panels %q and %q overlap", p.Title, q.Title)
			}
		}
		boxes = append(boxes, p)
		if p.Type == "row" {
			continue
		}
		if p.Title == "" || p.Description == "" || len(p.Targets) == 0 {
			t.Errorf("panel %d %q: want a title, a description and queries", p.ID, p.Title)
		}
		checkDatasource(t, "panel "+p.Title, p.Datasource)
		for _, tg := range p.Targets {
			checkDatasource(t, "panel "+p.Title+" query "+tg.RefID, tg.Datasource)
			where := "panel " + p.Title + " query " + tg.RefID
			c.check(t, where, substitute(where, tg.Expr))
		}
	}

	// What the dashboard must show.
	all := string(b)
	for _, want := range []struct{ what, re string }{
		{"decisions by result and path", `sum by \(path, result\) \(rate\(ration_decisions_total`},
		{"decision latency p50", `histogram_quantile\(0\.5, sum by \(le, path\) \(rate\(ration_decision_duration_seconds_bucket`},
		{"decision latency p99", `histogram_quantile\(0\.99, sum by \(le, path\) \(rate\(ration_decision_duration_seconds_bucket`},
		{"fallback activations", `ration_fallback_activations_total`},
		{"the overshoot bound", `ration_overshoot_bound_tokens`},
		{"lease pool per quota and region", `by \(region, rule\) \(ration_coordinator_quota_pool_tokens`},
		{"lease shares per quota and region", `by \(region, rule\) \(ration_coordinator_quota_leased_cap_tokens`},
		{"Raft leader changes", `ration_coordinator_leader_changes_total`},
		{"Raft apply latency", `ration_coordinator_apply_duration_seconds_bucket`},
	} {
		if !regexp.MustCompile(want.re).MatchString(all) {
			t.Errorf("the dashboard does not show %s (no query matching %s)", want.what, want.re)
		}
	}
	for _, l := range d.Links {
		if strings.Contains(l.URL, "runbook") && !strings.HasPrefix(l.URL, strings.TrimSuffix(runbookURL, "#")) {
			t.Errorf("link %s: %s, want the runbook at %s", l.Title, l.URL, runbookURL)
		}
	}
}

func checkDatasource(t *testing.T, where string, ds *datasource) {
	t.Helper()
	if ds == nil || ds.Type != "prometheus" || ds.UID != "${datasource}" {
		t.Errorf("%s: datasource %+v, want the ${datasource} variable", where, ds)
	}
}

// checkKeyCase reports object keys that match a field of typ only when
// case is ignored. json.RawMessage values are free-form and not checked.
func checkKeyCase(t *testing.T, where string, v any, typ reflect.Type) {
	t.Helper()
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	if typ == reflect.TypeOf(json.RawMessage{}) {
		return
	}
	switch x := v.(type) {
	case map[string]any:
		if typ.Kind() != reflect.Struct {
			return
		}
		fields := map[string]reflect.Type{}
		var collect func(reflect.Type)
		collect = func(typ reflect.Type) {
			for i := range typ.NumField() {
				f := typ.Field(i)
				name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
				if name == "-" {
					continue
				}
				if name == "" && f.Anonymous && f.Type.Kind() == reflect.Struct {
					collect(f.Type) // embedded, e.g. json:",inline"
					continue
				}
				if name == "" {
					name = f.Name
				}
				fields[name] = f.Type
			}
		}
		collect(typ)
		for k, val := range x {
			ft, ok := fields[k]
			if !ok {
				t.Errorf("%s: key %q is not Grafana's spelling", where, k)
				continue
			}
			checkKeyCase(t, where+"."+k, val, ft)
		}
	case []any:
		if typ.Kind() == reflect.Slice {
			for i, e := range x {
				checkKeyCase(t, fmt.Sprintf("%s[%d]", where, i), e, typ.Elem())
			}
		}
	}
}
