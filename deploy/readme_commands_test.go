package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// clusterDocs are the documents whose kubectl, helm and docker fences
// TestClusterCommands plays. test/doccmd skips them (they need a cluster,
// a Docker daemon and registries); this test checks them against the tree
// instead, each fence on an empty cluster of its own.
var clusterDocs = []string{"deploy/README.md", "docs/operations.md"}

// TestClusterCommands plays the documented kubectl, helm and docker
// commands, in order, against a model of a cluster: every path they name
// exists; kubectl apply -k builds with kustomize and lands in a namespace
// that exists by then (or that it creates); helm install renders the chart
// with exactly its -f and --set-file values into a namespace that exists;
// every namespace Ration runs in gets the CA secret ration-ca; a secret is
// read only once it exists (a cert-manager Certificate's secret after
// kubectl wait for it); files are written before they are read; docker
// build names a stage of its Dockerfile, from the repository root. A
// command the model does not know fails the test, so that a new one is
// checked too.
func TestClusterCommands(t *testing.T) {
	n := 0
	for _, doc := range clusterDocs {
		b, err := os.ReadFile(filepath.Join(repoRoot, doc))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range shellFences(string(b)) {
			cmds := shellCommands(f.body)
			if len(cmds) == 0 || !clusterTool[firstWord(cmds[0])] {
				continue
			}
			n++
			t.Run(fmt.Sprintf("%s:%d", filepath.Base(doc), f.line), func(t *testing.T) {
				c := newCluster()
				for _, cmd := range cmds {
					for _, part := range strings.Split(cmd, "&&") {
						if err := c.run(t, part); err != nil {
							t.Errorf("%s:%d: %s\n  %v", doc, f.line, strings.TrimSpace(part), err)
						}
					}
				}
				if err := c.done(); err != nil {
					t.Errorf("%s:%d: %v", doc, f.line, err)
				}
			})
		}
	}
	if n < 3 {
		t.Fatalf("found %d cluster fences in %v, want at least 3: the parser lost them", n, clusterDocs)
	}
}

var clusterTool = map[string]bool{"kubectl": true, "helm": true, "docker": true}

type shellFence struct {
	line int
	body string
}

var fenceOpen = regexp.MustCompile("^(\\s*)```(sh|bash|shell|console)\\s*$")

func shellFences(doc string) []shellFence {
	var out []shellFence
	lines := strings.Split(doc, "\n")
	for i := 0; i < len(lines); i++ {
		m := fenceOpen.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		f := shellFence{line: i + 1}
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
			f.body += strings.TrimPrefix(lines[i], m[1]) + "\n"
		}
		out = append(out, f)
	}
	return out
}

// shellCommands joins continued lines and drops blank and comment lines.
func shellCommands(body string) []string {
	var out []string
	cur := ""
	for _, l := range strings.Split(body, "\n") {
		if s, ok := strings.CutSuffix(l, "\\"); ok {
			cur += s + " "
			continue
		}
		cur += l
		if s := strings.TrimSpace(cur); s != "" && !strings.HasPrefix(s, "#") {
			out = append(out, s)
		}
		cur = ""
	}
	return out
}

func firstWord(cmd string) string {
	w, _, _ := strings.Cut(strings.TrimSpace(cmd), " ")
	return w
}

// shellWords splits a simple command as sh does: quotes and backslashes.
func shellWords(s string) ([]string, error) {
	var out []string
	var cur strings.Builder
	in, quote := false, byte(0)
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case quote != 0:
			if ch == quote {
				quote = 0
			} else {
				cur.WriteByte(ch)
			}
		case ch == '\'' || ch == '"':
			quote, in = ch, true
		case ch == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
			in = true
		case ch == ' ' || ch == '\t':
			if in {
				out = append(out, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteByte(ch)
			in = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated quote")
	}
	if in {
		out = append(out, cur.String())
	}
	return out, nil
}

// cluster is what the commands so far made: namespaces, secrets,
// cert-manager Certificates (namespace/name -> secret), and local files.
type cluster struct {
	namespaces map[string]bool
	secrets    map[string]bool // ns/name
	certs      map[string]string
	files      map[string]bool
	// needCA: the namespaces whose objects sign with the Issuer ration-ca.
	needCA map[string]bool
}

func newCluster() *cluster {
	return &cluster{namespaces: map[string]bool{}, secrets: map[string]bool{}, certs: map[string]string{}, files: map[string]bool{}, needCA: map[string]bool{}}
}

// done: every namespace that runs Ration has, by the end, its CA secret
// (or a Certificate that makes it).
func (c *cluster) done() error {
	for ns := range c.needCA {
		if c.secrets[ns+"/ration-ca"] {
			continue
		}
		made := false
		for k, s := range c.certs {
			made = made || strings.HasPrefix(k, ns+"/") && s == "ration-ca"
		}
		if !made {
			return fmt.Errorf("namespace %s runs Ration but never gets the CA secret ration-ca", ns)
		}
	}
	return nil
}

func (c *cluster) run(t *testing.T, cmd string) error {
	t.Helper()
	// One pipeline: the first stage is the command; a final > writes a file.
	stages := strings.Split(cmd, "|")
	last := stages[len(stages)-1]
	if head, file, ok := strings.Cut(last, ">"); ok {
		stages[len(stages)-1] = head
		defer func() { c.files[strings.TrimSpace(file)] = true }()
	}
	for _, s := range stages[1:] {
		if w := firstWord(s); w != "base64" {
			return fmt.Errorf("pipeline stage %q: the model knows base64 -d only", w)
		}
	}
	w, err := shellWords(stages[0])
	if err != nil {
		return err
	}
	if len(w) == 0 {
		return fmt.Errorf("empty command")
	}
	switch w[0] {
	case "kubectl":
		return c.kubectl(t, w[1:])
	case "helm":
		return c.helm(t, w[1:])
	case "docker":
		return dockerBuild(w[1:])
	case "shred":
		if len(w) != 3 || w[1] != "-u" || !c.files[w[2]] {
			return fmt.Errorf("shred -u of a file no command wrote")
		}
		delete(c.files, w[2])
		return nil
	}
	return fmt.Errorf("%s: the model does not know this command", w[0])
}

// flags splits args into -n/--namespace, the flags given as -x v or
// --x=v (repeatable), and the positional words.
func flags(args []string) (ns string, fl map[string][]string, pos []string) {
	fl = map[string][]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			pos = append(pos, a)
			continue
		}
		name, val, eq := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !eq {
			if name == "create-namespace" || name == "u" || name == "d" {
				fl[name] = append(fl[name], "")
				continue
			}
			if i+1 < len(args) {
				i++
				val = args[i]
			}
		}
		if name == "n" || name == "namespace" {
			ns = val
			continue
		}
		fl[name] = append(fl[name], val)
	}
	return ns, fl, pos
}

func (c *cluster) kubectl(t *testing.T, args []string) error {
	ns, fl, pos := flags(args)
	if len(pos) == 0 {
		return fmt.Errorf("kubectl without a verb")
	}
	switch {
	case len(pos) == 3 && pos[0] == "create" && pos[1] == "namespace":
		if c.namespaces[pos[2]] {
			return fmt.Errorf("namespace %s exists already: kubectl create fails", pos[2])
		}
		c.namespaces[pos[2]] = true
	case len(pos) >= 3 && pos[0] == "label" && pos[1] == "namespace":
		if !c.namespaces[pos[2]] {
			return fmt.Errorf("namespace %s does not exist yet", pos[2])
		}
	case pos[0] == "apply":
		if len(fl["k"]) != 1 || len(pos) != 1 {
			return fmt.Errorf("the model knows kubectl apply -k DIR only")
		}
		return c.applyKustomization(t, ns, fl["k"][0])
	case pos[0] == "wait":
		if len(pos) != 2 || !strings.HasPrefix(pos[1], "certificate/") || len(fl["for"]) != 1 || fl["for"][0] != "condition=Ready" {
			return fmt.Errorf("the model knows kubectl wait --for=condition=Ready certificate/NAME only")
		}
		s, ok := c.certs[ns+"/"+strings.TrimPrefix(pos[1], "certificate/")]
		if !ok {
			return fmt.Errorf("no Certificate %s applied in namespace %q", pos[1], ns)
		}
		c.secrets[ns+"/"+s] = true
	case len(pos) == 3 && pos[0] == "get" && pos[1] == "secret":
		if !c.secrets[ns+"/"+pos[2]] {
			if _, ok := slicesFind(c.certs, ns, pos[2]); ok {
				return fmt.Errorf("secret %s/%s: cert-manager issues it some time after the apply: kubectl wait --for=condition=Ready for its Certificate first", ns, pos[2])
			}
			return fmt.Errorf("no secret %s in namespace %q", pos[2], ns)
		}
	case len(pos) == 4 && pos[0] == "create" && pos[1] == "secret" && pos[2] == "tls":
		if !c.namespaces[ns] {
			return fmt.Errorf("namespace %q does not exist yet", ns)
		}
		for _, f := range []string{"cert", "key"} {
			if len(fl[f]) != 1 || !c.files[fl[f][0]] {
				return fmt.Errorf("--%s: a file no earlier command wrote", f)
			}
		}
		c.secrets[ns+"/"+pos[3]] = true
	default:
		return fmt.Errorf("the model does not know kubectl %s", strings.Join(pos, " "))
	}
	return nil
}

func slicesFind(certs map[string]string, ns, secret string) (string, bool) {
	for k, s := range certs {
		if strings.HasPrefix(k, ns+"/") && s == secret {
			return k, true
		}
	}
	return "", false
}

// applyKustomization builds dir with kustomize and applies what it makes.
func (c *cluster) applyKustomization(t *testing.T, ns, dir string) error {
	abs, err := filepath.Abs(filepath.Join(repoRoot, dir))
	if err != nil {
		return err
	}
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), abs)
	if err != nil {
		return fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	type object struct {
		Kind     string
		Metadata struct{ Name, Namespace string }
		Spec     struct {
			SecretName string `json:"secretName"`
			CA         *struct {
				SecretName string `json:"secretName"`
			} `json:"ca"`
		}
	}
	var objs []object
	for _, res := range rm.Resources() {
		b, err := res.AsYAML()
		if err != nil {
			return err
		}
		var o object
		if err := yaml.Unmarshal(b, &o); err != nil {
			return err
		}
		if o.Kind == "Namespace" {
			c.namespaces[o.Metadata.Name] = true
		}
		objs = append(objs, o)
	}
	for _, o := range objs {
		if o.Kind == "Namespace" {
			continue
		}
		on := o.Metadata.Namespace
		switch {
		case on != "" && ns != "" && on != ns:
			return fmt.Errorf("%s %s is in namespace %s, and -n %s: kubectl refuses the mismatch", o.Kind, o.Metadata.Name, on, ns)
		case on == "":
			on = ns
		}
		if on == "" {
			return fmt.Errorf("%s %s: no namespace (the kustomization sets none, and no -n)", o.Kind, o.Metadata.Name)
		}
		if !c.namespaces[on] {
			return fmt.Errorf("%s %s: namespace %s does not exist yet", o.Kind, o.Metadata.Name, on)
		}
		switch {
		case o.Kind == "Certificate":
			c.certs[on+"/"+o.Metadata.Name] = o.Spec.SecretName
		case o.Kind == "Issuer" && o.Spec.CA != nil:
			c.needCA[on] = true
			if o.Spec.CA.SecretName != "ration-ca" {
				return fmt.Errorf("Issuer %s signs with secret %s: the model expects ration-ca", o.Metadata.Name, o.Spec.CA.SecretName)
			}
		}
	}
	return nil
}

func (c *cluster) helm(t *testing.T, args []string) error {
	ns, fl, pos := flags(args)
	if len(pos) != 3 || pos[0] != "install" {
		return fmt.Errorf("the model knows helm install RELEASE CHART only")
	}
	if pos[2] != filepath.ToSlash(filepath.Join("deploy", chartDir)) {
		return fmt.Errorf("chart %s: the chart is deploy/%s", pos[2], chartDir)
	}
	if ns == "" {
		return fmt.Errorf("no -n: the release would go to the default namespace")
	}
	if len(fl["create-namespace"]) > 0 {
		c.namespaces[ns] = true
	}
	if !c.namespaces[ns] {
		return fmt.Errorf("namespace %s does not exist yet (kubectl create namespace, labelled, first)", ns)
	}
	vals := map[string]any{}
	for _, f := range fl["f"] {
		for k, v := range readValues(t, filepath.Join(repoRoot, f)) {
			vals[k] = v
		}
	}
	for _, sf := range fl["set-file"] {
		k, f, ok := strings.Cut(sf, "=")
		if !ok || strings.Contains(k, ".") {
			return fmt.Errorf("--set-file %s: the model knows top-level KEY=FILE only", sf)
		}
		b, err := os.ReadFile(filepath.Join(repoRoot, f))
		if err != nil {
			return err
		}
		vals[k] = string(b)
	}
	if _, err := renderChart(t, vals, ns); err != nil {
		return fmt.Errorf("rendering the chart: %w", err)
	}
	// The chart's Issuer ration-ca signs with the secret ration-ca.
	c.needCA[ns] = true
	return nil
}

// dockerBuild: docker build -f FILE --target STAGE -t TAG . from the
// repository root.
func dockerBuild(args []string) error {
	_, fl, pos := flags(args)
	if len(pos) != 2 || pos[0] != "build" || pos[1] != "." {
		return fmt.Errorf("the model knows docker build ... . (the repository root as context) only")
	}
	if len(fl["f"]) != 1 || len(fl["target"]) != 1 || len(fl["t"]) != 1 {
		return fmt.Errorf("want -f, --target and -t once each")
	}
	b, err := os.ReadFile(filepath.Join(repoRoot, fl["f"][0]))
	if err != nil {
		return err
	}
	if !regexp.MustCompile(`(?m)^FROM\s+\S+\s+AS\s+` + regexp.QuoteMeta(fl["target"][0]) + `\s*$`).Match(b) {
		return fmt.Errorf("%s has no stage %s", fl["f"][0], fl["target"][0])
	}
	return nil
}
