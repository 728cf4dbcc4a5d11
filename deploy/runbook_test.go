package deploy

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// TestRunbook holds docs/runbook.md to the code and the manifests: the
// procedures the issue asks for are there; its links resolve; every
// metric, RATION_* variable and quoted log message it names exists; every
// coordinator or gateway-agent command line in it uses commands and flags
// the binaries accept; the Kubernetes names in its kubectl lines are the
// manifests' names; membership changes use coordinator members, not grpcurl.
func TestRunbook(t *testing.T) {
	path := filepath.Join(repoRoot, "docs", "runbook.md")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	anchors := runbookAnchors(t)
	for _, h := range []string{
		"Adding a coordinator node", "Removing a coordinator node", "Restoring from a snapshot",
		"Rotating a region out", "Changing lease sizes safely", "Upgrading agents and coordinators without overshoot",
	} {
		if !anchors[githubAnchor(h)] {
			t.Errorf("no section %q", h)
		}
	}

	// Links: relative files exist, in-page anchors exist.
	for _, m := range regexp.MustCompile(`\]\(([^)\s]+)\)`).FindAllStringSubmatch(doc, -1) {
		target := m[1]
		if strings.HasPrefix(target, "http") {
			continue
		}
		file, anchor, _ := strings.Cut(target, "#")
		if file == "" {
			if !anchors[anchor] {
				t.Errorf("link %s: no such section", target)
			}
			continue
		}
		if _, err := os.Stat(filepath.Join(repoRoot, "docs", file)); err != nil {
			t.Errorf("link %s: %v", target, err)
		}
	}

	ex := exportedMetrics(t)
	for _, m := range uniq(regexp.MustCompile(`\bration_[a-z0-9_]*[a-z0-9]\b`).FindAllString(doc, -1)) {
		if ex[m] == nil {
			t.Errorf("runbook names metric %s, which neither binary exports", m)
		}
	}
	agentCLI, coordCLI := help(t, "gateway-agent"), help(t, "coordinator")
	for _, v := range uniq(regexp.MustCompile(`\bRATION_[A-Z0-9_]+`).FindAllString(doc, -1)) {
		if _, ok := agentCLI.env[v]; !ok {
			if _, ok := coordCLI.env[v]; !ok {
				t.Errorf("runbook names %s, which neither binary reads", v)
			}
		}
	}
	for _, m := range regexp.MustCompile(`msg="([^"]+)"`).FindAllStringSubmatch(doc, -1) {
		if !inSource(t, m[1]) {
			t.Errorf("runbook quotes log message %q, which the code does not log", m[1])
		}
	}

	// Words in inline code (rule fields and their values, commands,
	// metrics) are the code's own: each is a string literal of the code
	// or a key of the manifests, so the runbook cannot suggest a rule field
	// or a setting that does not exist.
	keys := manifestKeys(t)
	for _, w := range inlineCodeWords(doc) {
		if !inSource(t, w) && !keys[w] {
			t.Errorf("runbook names `%s`, which is neither a string of the code nor a key of the manifests", w)
		}
	}

	// Command lines in code (fenced blocks and inline spans), where the
	// binary is the command: at the start, or after a path.
	code := codeOf(doc)
	subFlags := map[string]map[string]bool{}
	cmdLine := regexp.MustCompile(`(?m)(?:^\s*|/)(coordinator|gateway-agent)((?: +(?:[a-z]+|-[a-z-]+(?:[ =][^\s-][^\s]*)?|'[^']*'|\\\n\s*))+)`)
	for _, ix := range cmdLine.FindAllStringSubmatchIndex(code, -1) {
		if strings.HasSuffix(code[:ix[2]], "statefulset/") {
			continue // a kubectl object name, not the binary
		}
		bin, rest := code[ix[2]:ix[3]], strings.ReplaceAll(code[ix[4]:ix[5]], "\\\n", " ")
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		known := agentCLI.flags
		where := bin
		if bin == "coordinator" {
			known = coordCLI.flags
			if !strings.HasPrefix(fields[0], "-") {
				cmd := fields[0]
				if _, ok := subFlags[cmd]; !ok {
					subFlags[cmd] = subcommandFlags(t, cmd)
				}
				known, where, fields = subFlags[cmd], "coordinator "+cmd, fields[1:]
				if known == nil {
					t.Errorf("runbook runs %q: no such coordinator command", "coordinator "+cmd)
					continue
				}
			}
		}
		for _, f := range fields {
			if !strings.HasPrefix(f, "-") {
				continue
			}
			name, _, _ := strings.Cut(strings.TrimLeft(f, "-"), "=")
			if !known[name] {
				t.Errorf("runbook runs %s with %s, which it does not accept", where, f)
			}
		}
	}
	if len(subFlags) < 4 {
		t.Errorf("found %d coordinator commands in the runbook (%v): the command-line check is not reading it", len(subFlags), sortedKeys(subFlags))
	}

	// kubectl names: namespaces, StatefulSets, Deployments, claims, pods.
	names := map[string]map[string]bool{"ns": {}, "statefulset": {}, "deploy": {}, "pvc": {}, "pod": {}, "container": {}}
	for _, dir := range overlays(t) {
		r := render(t, dir)
		for _, n := range all[*corev1.Namespace](r) {
			names["ns"][n.Name] = true
		}
		for _, s := range all[*appsv1.StatefulSet](r) {
			names["statefulset"][s.Name] = true
			for i := range int(*s.Spec.Replicas) + 2 { // the runbook grows the group to 5
				pod := s.Name + "-" + string(rune('0'+i))
				names["pod"][pod] = true
				for _, v := range s.Spec.VolumeClaimTemplates {
					names["pvc"][v.Name+"-"+pod] = true
				}
			}
			for _, c := range s.Spec.Template.Spec.Containers {
				names["container"][c.Name] = true
			}
		}
		for _, d := range all[*appsv1.Deployment](r) {
			names["deploy"][d.Name] = true
		}
	}
	var kubectl string
	for _, l := range strings.Split(code, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "kubectl ") {
			kubectl += l + "\n"
		}
	}
	for _, c := range []struct{ kind, re string }{
		{"ns", `kubectl -n (\S+)`},
		{"statefulset", `statefulset[ /]([a-z0-9-]+)`},
		{"deploy", `port-forward deploy/([a-z0-9-]+)`},
		{"pvc", `(data-[a-z0-9-]+)`},
		{"pod", `(?:exec|port-forward|delete pod) (coordinator-\d)`},
		{"container", `statefulset/[a-z0-9-]+ ([a-z0-9-]+)=`},
	} {
		ms := regexp.MustCompile(c.re).FindAllStringSubmatch(kubectl, -1)
		if len(ms) == 0 {
			t.Errorf("runbook: no %s name found with %s", c.kind, c.re)
		}
		for _, m := range ms {
			if !names[c.kind][m[1]] {
				t.Errorf("runbook names %s %q, which the manifests do not define (%v)", c.kind, m[1], sortedKeys(names[c.kind]))
			}
		}
	}

	// Membership: the coordinator's own commands (their flags are checked
	// with the other command lines above), no grpcurl and proto file.
	for _, want := range []string{"coordinator members list", "coordinator members add", "coordinator members remove"} {
		if !strings.Contains(code, want) {
			t.Errorf("the runbook never runs %q", want)
		}
	}
	if strings.Contains(doc, "grpcurl") {
		t.Error("the runbook calls grpcurl: membership changes are coordinator members add and remove")
	}
}

// subcommandFlags returns the flags of `coordinator CMD -h`, or nil if CMD
// is not a command.
func subcommandFlags(t testing.TB, cmd string) map[string]bool {
	t.Helper()
	out, err := exec.Command(binary(t, "coordinator"), cmd, "-h").CombinedOutput()
	if err != nil {
		return nil
	}
	flags := map[string]bool{}
	for _, l := range strings.Split(string(out), "\n") {
		if m := flagLine.FindStringSubmatch(l); m != nil {
			flags[m[1]] = true
		}
	}
	return flags
}

func uniq(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

// inlineCodeWords returns the inline code spans of a Markdown text that
// are one lower-case word (`on_failure`, `fail_closed`), and the keys of
// the spans written as YAML (`mode: leased`, `scope: global, mode: redis`).
func inlineCodeWords(doc string) []string {
	prose := regexp.MustCompile("(?s)```.*?```").ReplaceAllString(doc, "")
	word := regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	yamlKey := regexp.MustCompile(`(?:^|, )([a-z][a-z0-9_.]*): `)
	var out []string
	for _, m := range regexp.MustCompile("`([^`\n]+)`").FindAllStringSubmatch(prose, -1) {
		span := m[1]
		if word.MatchString(span) {
			out = append(out, span)
			continue
		}
		for _, k := range yamlKey.FindAllStringSubmatch(span, -1) {
			out = append(out, strings.Split(k[1], ".")...)
		}
	}
	return uniq(out)
}

// manifestKeys returns every mapping key of the Kubernetes manifests.
func manifestKeys(t testing.TB) map[string]bool {
	t.Helper()
	key := regexp.MustCompile(`(?m)^\s*(?:-\s+)?([A-Za-z][A-Za-z0-9_]*):`)
	keys := map[string]bool{}
	err := filepath.WalkDir(kubeDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".yaml") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range key.FindAllStringSubmatch(string(b), -1) {
			keys[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !keys["replicas"] || !keys["containers"] {
		t.Fatalf("read %d keys from the manifests: the scan is not reading them", len(keys))
	}
	return keys
}

// codeOf returns the fenced code blocks and inline code spans of a
// Markdown text, one per line (continuation lines joined).
func codeOf(doc string) string {
	var b strings.Builder
	inFence := false
	for _, l := range strings.Split(doc, "\n") {
		if strings.HasPrefix(l, "```") {
			inFence = !inFence
			continue
		}
		if inFence {
			b.WriteString(l + "\n")
			continue
		}
	}
	// Inline spans may wrap across lines in prose.
	prose := regexp.MustCompile("(?s)```.*?```").ReplaceAllString(doc, "")
	for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(prose, -1) {
		b.WriteString(strings.Join(strings.Fields(m[1]), " ") + "\n")
	}
	return strings.ReplaceAll(b.String(), "\\\n", " ")
}

// TestRunbookCodeWords: the word check of TestRunbook reads inline code
// and YAML keys, not fenced blocks, and would refuse a rule field the code
// does not have (the runbook once suggested `reserve`).
func TestRunbookCodeWords(t *testing.T) {
	got := inlineCodeWords("a leased rule with `reserve`; `mode: leased`, `scope: global, mode: redis`, `lease.min_slice: 1`, `kubectl get pods`\n```\n`fenced`\n```\n")
	want := []string{"reserve", "mode", "scope", "lease", "min_slice"}
	if !slices.Equal(got, want) {
		t.Errorf("inlineCodeWords = %q, want %q", got, want)
	}
	if inSource(t, "reserve") || manifestKeys(t)["reserve"] {
		t.Error("reserve is a string of the code or a manifest key: the check would not catch it")
	}
	for _, w := range []string{"on_failure", "max_slice", "fail_closed", "mode"} {
		if !inSource(t, w) {
			t.Errorf("%s is not found in the code: the source scan is not reading it", w)
		}
	}
}
