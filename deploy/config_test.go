package deploy

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
)

// cli is what a binary's -h says it accepts: flags, and the RATION_*
// variable each usage line names ("(env RATION_X)").
type cli struct {
	flags map[string]bool
	env   map[string]string // variable -> flag
}

var (
	flagLine = regexp.MustCompile(`^  -([A-Za-z0-9][A-Za-z0-9._-]*)`)
	envName  = regexp.MustCompile(`\benv (RATION_[A-Z0-9_]+)\b`)
)

func help(t testing.TB, name string) cli {
	t.Helper()
	out, err := exec.Command(binary(t, name), "-h").CombinedOutput()
	if err != nil {
		t.Fatalf("%s -h: %v\n%s", name, err, out)
	}
	c := cli{flags: map[string]bool{}, env: map[string]string{}}
	current := ""
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if m := flagLine.FindStringSubmatch(sc.Text()); m != nil {
			current = m[1]
			c.flags[current] = true
		}
		for _, m := range envName.FindAllStringSubmatch(sc.Text(), -1) {
			if current == "" {
				t.Fatalf("%s -h: %s named before any flag", name, m[1])
			}
			c.env[m[1]] = current
		}
	}
	if len(c.flags) < 5 || len(c.env) < 5 {
		t.Fatalf("%s -h: read %d flags and %d variables from:\n%s", name, len(c.flags), len(c.env), out)
	}
	return c
}

// TestHelpParsing: the reading of -h finds what the code binds (a few
// flags and variables every version has).
func TestHelpParsing(t *testing.T) {
	for name, want := range map[string][]string{
		"gateway-agent": {"RATION_RULES", "RATION_REDIS", "RATION_HTTP", "RATION_BREAKER_THRESHOLD"},
		"coordinator":   {"RATION_ID", "RATION_RAFT", "RATION_DATA_DIR", "RATION_BOOTSTRAP", "RATION_BATCH_MAX"},
	} {
		c := help(t, name)
		for _, v := range want {
			if c.env[v] == "" {
				t.Errorf("%s -h: %s not found (read %v)", name, v, sortedKeys(c.env))
			}
		}
	}
}

// checkNames reports variables and flags that the binary does not accept.
// Other variables must be the downward-API helpers the manifests use.
func checkNames(t *testing.T, where string, c cli, vars map[string]string, flags []string, helpers []string) {
	t.Helper()
	for v := range vars {
		if strings.HasPrefix(v, "RATION_") {
			if _, ok := c.env[v]; !ok {
				t.Errorf("%s: %s is not read by the binary (its -h names %v)", where, v, sortedKeys(c.env))
			}
		} else if !slices.Contains(helpers, v) {
			t.Errorf("%s: %s is neither a RATION_* variable nor one of %v", where, v, helpers)
		}
	}
	for _, f := range flags {
		name, _, _ := strings.Cut(strings.TrimLeft(f, "-"), "=")
		if !c.flags[name] {
			t.Errorf("%s: flag %s is not accepted by the binary", where, f)
		}
	}
}

// runCoordinatorValidate runs coordinator -validate with env (the
// manifest's values, rules and data dir pointed at temporary copies):
// every value must parse and the whole configuration validate.
func runCoordinatorValidate(t *testing.T, where string, env map[string]string, rules string, args ...string) {
	t.Helper()
	dir := t.TempDir()
	rulesFile := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesFile, []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	var kv []string
	for k, v := range env {
		switch k {
		case "RATION_RULES":
			v = rulesFile
		case "RATION_DATA_DIR":
			v = filepath.Join(dir, "data")
		}
		kv = append(kv, k+"="+v)
	}
	cmd := exec.Command(binary(t, "coordinator"), append(args, "-validate")...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, kv...)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "configuration valid") {
		t.Errorf("%s: coordinator -validate with %q: %v\n%s", where, kv, err, out)
	}
}

// startAgent starts gateway-agent with env and flags (the manifest's
// values; listen addresses on loopback, Redis and coordinators at closed
// loopback ports, rules at a temporary copy, TLS files at a certificate
// naming the agent's id, as its csi-driver volume would) and waits for it
// to start: every value must parse and validate, and the agent must
// accept its region for the rules and its certificate for its id.
// Nothing outside loopback is contacted.
func startAgent(t *testing.T, where string, env map[string]string, rules string, flags ...string) {
	t.Helper()
	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rulesFile, []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	cert, key, ca := testCerts(t, "ration://agent/"+env["RATION_AGENT_ID"])
	var kv []string
	for k, v := range env {
		switch k {
		case "RATION_RULES":
			v = rulesFile
		case "RATION_HTTP", "RATION_GRPC":
			v = "127.0.0.1:0"
		case "RATION_REDIS", "RATION_COORDINATORS":
			v = closedPort(t)
		case "RATION_TLS_CERT":
			v = cert
		case "RATION_TLS_KEY":
			v = key
		case "RATION_TLS_CA":
			v = ca
		}
		kv = append(kv, k+"="+v)
	}
	p := start(t, "gateway-agent", kv, flags...)
	p.wait(t, agentStarted, 30*time.Second)
	p.stop(t)
	if strings.Contains(p.output(), "level=ERROR") {
		t.Errorf("%s: the agent logged errors:\n%s", where, p.output())
	}
}

// TestManifestConfigAccepted: every RATION_* variable and flag in the
// Kubernetes manifests is one the binaries read, and the binaries accept
// the values: the coordinator's -validate passes for each member (as
// coordinator-launch would start it), and the agent starts with them.
func TestManifestConfigAccepted(t *testing.T) {
	agentCLI, coordCLI := help(t, "gateway-agent"), help(t, "coordinator")
	rules := manifestRules(t)
	for _, dir := range overlays(t) {
		r := render(t, dir)
		for _, sts := range all[*appsv1.StatefulSet](r) {
			c := sts.Spec.Template.Spec.Containers[0]
			for i := range int(*sts.Spec.Replicas) {
				e := coordinatorEnv(t, r, i)
				where := dir + " " + sts.Name + "-" + string(rune('0'+i))
				checkNames(t, where, coordCLI, e, c.Args, []string{"POD_NAME", "POD_NAMESPACE"})
				if i == 0 {
					// What coordinator-launch runs when no member is ready.
					boot := map[string]string{"RATION_BOOTSTRAP": "true"}
					for k, v := range e {
						if k != "RATION_JOIN" {
							boot[k] = v
						}
					}
					runCoordinatorValidate(t, where+" (bootstrap)", boot, rules[dir], c.Args...)
				}
				runCoordinatorValidate(t, where, e, rules[dir], c.Args...)
			}
		}
		for _, dep := range all[*appsv1.Deployment](r) {
			for _, c := range append(slices.Clone(dep.Spec.Template.Spec.InitContainers), dep.Spec.Template.Spec.Containers...) {
				if c.Name != "gateway-agent" {
					continue
				}
				e := env(t, c, map[string]string{"metadata.name": dep.Name + "-abc12-xyz34", "metadata.namespace": dep.Namespace})
				where := dir + " " + dep.Name + "/" + c.Name
				checkNames(t, where, agentCLI, e, c.Args, []string{"POD_NAME"})
				startAgent(t, where, e, rules[dir], c.Args...)
			}
		}
	}
}

// TestRulesValid: every overlay's rules file passes both binaries'
// -validate, and the scope: global rules are the same in every overlay
// (the global group and the regions must agree on them) and name every
// region that has an overlay.
func TestRulesValid(t *testing.T) {
	rules := manifestRules(t)
	global := map[string]string{} // rule name -> its YAML, as first seen
	regions := map[string]bool{}
	for _, dir := range overlays(t) {
		f := filepath.Join(t.TempDir(), "rules.yaml")
		if err := os.WriteFile(f, []byte(rules[dir]), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, bin := range []string{"gateway-agent", "coordinator"} {
			args := []string{"-validate", "-rules", f}
			if bin == "coordinator" {
				args = append(args, "-insecure") // the rules are what is checked
			}
			out, err := exec.Command(binary(t, bin), args...).CombinedOutput()
			if err != nil {
				t.Errorf("%s: %s -validate: %v\n%s", dir, bin, err, out)
			}
		}
		var doc struct {
			Rules []map[string]any `json:"rules"`
		}
		if err := yaml.Unmarshal([]byte(rules[dir]), &doc); err != nil {
			t.Fatal(err)
		}
		for _, r := range doc.Rules {
			if r["scope"] != "global" {
				continue
			}
			b, _ := yaml.Marshal(r)
			name := r["name"].(string)
			if prev, ok := global[name]; ok && prev != string(b) {
				t.Errorf("%s: global rule %s differs from another overlay's:\n%s\nvs\n%s", dir, name, b, prev)
			}
			global[name] = string(b)
		}
		r := render(t, dir)
		for _, d := range all[*appsv1.Deployment](r) {
			for _, c := range d.Spec.Template.Spec.InitContainers {
				if c.Name == "gateway-agent" {
					regions[env(t, c, map[string]string{"metadata.name": "x"})["RATION_REGION"]] = true
				}
			}
		}
	}
	if len(global) == 0 {
		t.Error("no scope: global rule in any overlay: the global group would have nothing to lease")
	}
	for name, y := range global {
		var r struct {
			Regions map[string]any `json:"regions"`
		}
		yaml.Unmarshal([]byte(y), &r)
		for region := range regions {
			if _, ok := r.Regions[region]; !ok {
				t.Errorf("global rule %s has no share for region %s, which has an overlay", name, region)
			}
		}
	}
}

// unit is a systemd unit file: section -> key -> values.
type unit map[string]map[string][]string

func readUnit(t testing.TB, path string) unit {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	u := unit{}
	section := ""
	for i, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		switch {
		case l == "" || strings.HasPrefix(l, "#") || strings.HasPrefix(l, ";"):
		case strings.HasPrefix(l, "["):
			section = strings.Trim(l, "[]")
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(l, "=")
			if !ok || section == "" {
				t.Fatalf("%s:%d: %q", path, i+1, l)
			}
			u[section][k] = append(u[section][k], v)
		}
	}
	return u
}

func readEnvFile(t testing.TB, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for i, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		k, v, ok := strings.Cut(l, "=")
		if !ok || strings.ContainsAny(v, `"'$ `) {
			t.Errorf("%s:%d: %q: want NAME=value, unquoted, no spaces or $", path, i+1, l)
		}
		if _, dup := out[k]; dup {
			t.Errorf("%s:%d: %s set twice", path, i+1, k)
		}
		out[k] = v
	}
	return out
}

// TestSystemdUnits: systemd-analyze verify accepts the units; the binary
// each runs is one the Dockerfile builds; every flag and variable of the
// unit and its example environment file is accepted by that binary with
// its value (coordinator -validate; the agent starts).
func TestSystemdUnits(t *testing.T) {
	units, _ := filepath.Glob(filepath.Join("systemd", "*.service"))
	if len(units) != 2 {
		t.Fatalf("want the two units, have %v", units)
	}
	rules := manifestRules(t)[filepath.Join(kubeDir, "overlays", testRegion)]
	tmp := t.TempDir()
	var verify []string
	for _, path := range units {
		u := readUnit(t, path)
		execStart := u["Service"]["ExecStart"]
		if len(execStart) != 1 {
			t.Fatalf("%s: want one ExecStart", path)
		}
		argv := strings.Fields(execStart[0])
		bin := filepath.Base(argv[0])
		if bin != "coordinator" && bin != "gateway-agent" {
			t.Fatalf("%s: ExecStart runs %s, not a Ration binary", path, argv[0])
		}
		c := help(t, bin)
		env := map[string]string{}
		for _, ef := range u["Service"]["EnvironmentFile"] {
			local := filepath.Join("systemd", filepath.Base(strings.TrimPrefix(ef, "-")))
			for k, v := range readEnvFile(t, local) {
				env[k] = v
			}
		}
		for _, e := range u["Service"]["Environment"] {
			k, v, _ := strings.Cut(e, "=")
			env[k] = v
		}
		checkNames(t, path, c, env, argv[1:], nil)
		if u["Service"]["DynamicUser"] == nil && u["Service"]["User"] == nil {
			t.Errorf("%s: runs as root: set DynamicUser=yes or User=", path)
		}
		if bin == "coordinator" {
			if dd := env["RATION_DATA_DIR"]; !strings.HasPrefix(dd, "/var/lib/"+strings.Join(u["Service"]["StateDirectory"], "")+"/") {
				t.Errorf("%s: RATION_DATA_DIR %s is not below StateDirectory (the only writable place under ProtectSystem=strict)", path, dd)
			}
			stop := duration(t, "TimeoutStopSec", u["Service"]["TimeoutStopSec"][0])
			if st := duration(t, "RATION_SHUTDOWN_TIMEOUT", env["RATION_SHUTDOWN_TIMEOUT"]); stop < st+5*time.Second {
				t.Errorf("%s: TimeoutStopSec %v < RATION_SHUTDOWN_TIMEOUT %v + 5s: systemd would kill a leadership transfer", path, stop, st)
			}
			runCoordinatorValidate(t, path, env, rules, argv[1:]...)
		} else {
			stop := duration(t, "TimeoutStopSec", u["Service"]["TimeoutStopSec"][0])
			if st := duration(t, "RATION_SHUTDOWN_TIMEOUT", env["RATION_SHUTDOWN_TIMEOUT"]); stop < st+5*time.Second {
				t.Errorf("%s: TimeoutStopSec %v < RATION_SHUTDOWN_TIMEOUT %v + 5s", path, stop, st)
			}
			startAgent(t, path, env, rules, argv[1:]...)
		}
		// systemd-analyze verify checks the executable exists: point
		// ExecStart at the binary built here.
		b, _ := os.ReadFile(path)
		fixed := strings.ReplaceAll(string(b), argv[0], binary(t, bin))
		dst := filepath.Join(tmp, filepath.Base(path))
		if err := os.WriteFile(dst, []byte(fixed), 0o644); err != nil {
			t.Fatal(err)
		}
		verify = append(verify, dst)
	}
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Fatalf("systemd-analyze not found (Debian package systemd, part of the machine image): %v", err)
	}
	out, err := exec.Command("systemd-analyze", append([]string{"verify"}, verify...)...).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}
