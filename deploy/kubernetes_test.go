package deploy

import (
	"fmt"
	"net"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

const kubeDir = "kubernetes"

// strictDecoder decodes YAML into the Kubernetes API types (and
// cert-manager's Issuer and Certificate, certmanager_test.go) the way the
// API server's strict field validation does: unknown fields, duplicate
// fields and wrong case are errors, and so is a kind no group here
// defines.
var strictDecoder = func() runtime.Decoder {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, policyv1.AddToScheme, networkingv1.AddToScheme, addCertManager} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return json.NewSerializerWithOptions(json.DefaultMetaFactory, s, s, json.SerializerOptions{Yaml: true, Strict: true})
}()

// decodeAll splits a YAML stream into documents and decodes each strictly.
func decodeAll(t testing.TB, name string, b []byte) []runtime.Object {
	t.Helper()
	var out []runtime.Object
	for i, doc := range splitYAML(b) {
		obj, _, err := strictDecoder.Decode(doc, nil, nil)
		if err != nil {
			t.Errorf("%s document %d: %v", name, i+1, err)
			continue
		}
		out = append(out, obj)
	}
	return out
}

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

func splitYAML(b []byte) [][]byte {
	var docs [][]byte
	for _, d := range docSep.Split(string(b), -1) {
		if strings.TrimSpace(stripComments(d)) != "" {
			docs = append(docs, []byte(d))
		}
	}
	return docs
}

func stripComments(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// overlays lists the kustomizations operators apply: one per region and
// the global group's.
func overlays(t testing.TB) []string {
	t.Helper()
	ks, err := filepath.Glob(filepath.Join(kubeDir, "overlays", "*", "kustomization.yaml"))
	if err != nil || len(ks) < 2 {
		t.Fatalf("want a region's and the global group's overlay under %s/overlays, have %v (%v)", kubeDir, ks, err)
	}
	var dirs []string
	for _, k := range ks {
		dirs = append(dirs, filepath.Dir(k))
	}
	return dirs
}

// kustomizations lists every kustomization: the overlays and the pieces
// they are made of.
func kustomizations(t testing.TB) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(kubeDir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == "kustomization.yaml" {
			dirs = append(dirs, filepath.Dir(p))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

func readKustomization(t testing.TB, dir string) types.Kustomization {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k types.Kustomization
	if err := yaml.UnmarshalStrict(b, &k); err != nil {
		t.Fatalf("%s/kustomization.yaml: %v", dir, err)
	}
	if tt, ok := t.(*testing.T); ok {
		var raw any
		if err := yaml.Unmarshal(b, &raw); err != nil {
			t.Fatal(err)
		}
		checkKeyCase(tt, dir+"/kustomization.yaml", raw, reflect.TypeOf(k))
	}
	return k
}

// TestManifestsDecodeStrictly decodes every file under deploy/kubernetes:
// the resources and patches each kustomization names into the Kubernetes
// API types, the kustomizations into kustomize's own type, and checks that
// no file is left out of every kustomization (so none escapes the test).
func TestManifestsDecodeStrictly(t *testing.T) {
	used := map[string]string{}
	for _, dir := range kustomizations(t) {
		used[filepath.Join(dir, "kustomization.yaml")] = "kustomization"
		k := readKustomization(t, dir)
		for _, r := range k.Resources {
			p := filepath.Join(dir, r)
			if st, err := os.Stat(p); err == nil && st.IsDir() {
				continue // another kustomization, decoded on its own
			}
			used[p] = "resource"
		}
		for _, p := range k.Patches {
			if p.Path == "" {
				t.Errorf("%s: inline patch: keep patches in files so that they are decoded here", dir)
				continue
			}
			used[filepath.Join(dir, p.Path)] = "patch"
		}
		for _, g := range k.ConfigMapGenerator {
			for _, f := range g.FileSources {
				if _, file, ok := strings.Cut(f, "="); ok {
					f = file
				}
				used[filepath.Join(dir, f)] = "data"
			}
		}
	}
	n := 0
	err := filepath.WalkDir(kubeDir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		role, ok := used[p]
		if !ok {
			t.Errorf("%s is in no kustomization: apply would miss it, and so would this test", p)
			return nil
		}
		if role == "resource" || role == "patch" {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			n += len(decodeAll(t, p, b))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 8 {
		t.Errorf("decoded %d objects; the base alone has more", n)
	}
}

// rendering is one kustomization built and decoded.
type rendering struct {
	dir  string
	objs []runtime.Object
}

func render(t testing.TB, dir string) rendering {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	rm, err := k.Run(filesys.MakeFsOnDisk(), abs)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	r := rendering{dir: dir}
	for _, res := range rm.Resources() {
		b, err := res.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		r.objs = append(r.objs, decodeAll(t, dir+" "+res.CurId().String(), b)...)
	}
	return r
}

func get[T runtime.Object](r rendering, name string) T {
	var zero T
	for _, o := range r.objs {
		if v, ok := o.(T); ok && metaName(o) == name {
			return v
		}
	}
	return zero
}

func all[T runtime.Object](r rendering) []T {
	var out []T
	for _, o := range r.objs {
		if v, ok := o.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

func metaName(o runtime.Object) string {
	switch v := o.(type) {
	case *corev1.Service:
		return v.Name
	case *corev1.ConfigMap:
		return v.Name
	case *corev1.Namespace:
		return v.Name
	case *appsv1.StatefulSet:
		return v.Name
	case *appsv1.Deployment:
		return v.Name
	case *policyv1.PodDisruptionBudget:
		return v.Name
	case *networkingv1.NetworkPolicy:
		return v.Name
	case *cmIssuer:
		return v.Name
	case *cmCertificate:
		return v.Name
	}
	return ""
}

// env returns a container's variables with $(VAR) references expanded the
// way the kubelet does (only variables defined earlier in the list), and
// values from the downward API filled in from pod.
func env(t testing.TB, c corev1.Container, pod map[string]string) map[string]string {
	t.Helper()
	out := map[string]string{}
	ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	for _, e := range c.Env {
		if _, dup := out[e.Name]; dup {
			t.Errorf("container %s: %s set twice", c.Name, e.Name)
		}
		if e.ValueFrom != nil {
			if e.ValueFrom.FieldRef == nil {
				t.Errorf("container %s: %s: only fieldRef values are expected", c.Name, e.Name)
				continue
			}
			v, ok := pod[e.ValueFrom.FieldRef.FieldPath]
			if !ok {
				t.Errorf("container %s: %s: fieldRef %s not known to the test", c.Name, e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
			out[e.Name] = v
			continue
		}
		out[e.Name] = ref.ReplaceAllStringFunc(e.Value, func(m string) string {
			name := ref.FindStringSubmatch(m)[1]
			v, ok := out[name]
			if !ok {
				t.Errorf("container %s: %s refers to $(%s), which is not defined before it", c.Name, e.Name, name)
			}
			return v
		})
	}
	return out
}

func hostPort(t testing.TB, what, addr string) (string, int) {
	t.Helper()
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("%s %q: %v", what, addr, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatalf("%s %q: port: %v", what, addr, err)
	}
	return h, n
}

func containerPort(c corev1.Container, port intstr.IntOrString) int {
	if port.Type == intstr.Int {
		return port.IntValue()
	}
	for _, p := range c.Ports {
		if p.Name == port.StrVal {
			return int(p.ContainerPort)
		}
	}
	return -1
}

// serviceFor resolves "name.namespace.svc:port" (or "name:port" in ns)
// to a Service of the rendering exposing that port.
func serviceFor(t testing.TB, r rendering, what, addr, ns string) *corev1.Service {
	t.Helper()
	host, port := hostPort(t, what, addr)
	name, rest, _ := strings.Cut(host, ".")
	if rest != "" && rest != ns+".svc" && rest != ns+".svc.cluster.local" {
		t.Errorf("%s %q: not a Service of namespace %s", what, addr, ns)
		return nil
	}
	svc := get[*corev1.Service](r, name)
	if svc == nil {
		t.Errorf("%s %q: no Service %s in %s", what, addr, name, r.dir)
		return nil
	}
	for _, p := range svc.Spec.Ports {
		if int(p.Port) == port {
			return svc
		}
	}
	t.Errorf("%s %q: Service %s has no port %d", what, addr, name, port)
	return nil
}

func selects(sel map[string]string, lbls map[string]string) bool {
	return len(sel) > 0 && labels.SelectorFromSet(sel).Matches(labels.Set(lbls))
}

func duration(t testing.TB, what, v string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s %q: %v", what, v, err)
	}
	return d
}

// mountedFile checks that file is inside a read-only, whole-directory
// mount of ConfigMap cm holding key, and returns the ConfigMap's data.
func mountedFile(t testing.TB, r rendering, spec corev1.PodSpec, c corev1.Container, file, cm string) string {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if path.Dir(file) != m.MountPath {
			continue
		}
		if m.SubPath != "" || m.SubPathExpr != "" {
			t.Errorf("container %s: %s is mounted with subPath: ConfigMap updates never reach it", c.Name, file)
		}
		for _, v := range spec.Volumes {
			if v.Name != m.Name {
				continue
			}
			if v.ConfigMap == nil || v.ConfigMap.Name != cm {
				t.Errorf("container %s: %s is not from ConfigMap %s", c.Name, file, cm)
				return ""
			}
			got := get[*corev1.ConfigMap](r, cm)
			if got == nil {
				t.Errorf("%s: ConfigMap %s is not in the rendering", r.dir, cm)
				return ""
			}
			data, ok := got.Data[path.Base(file)]
			if !ok {
				t.Errorf("ConfigMap %s has no key %s", cm, path.Base(file))
			}
			return data
		}
	}
	t.Errorf("container %s: %s is in no volume mount", c.Name, file)
	return ""
}

// dockerEntrypointFiles returns the files a run-time stage of the
// Dockerfile puts in the image.
func dockerStageFiles(t testing.TB, stage string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("docker", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	d, err := parseDockerfile(b)
	if err != nil {
		t.Fatal(err)
	}
	st := d.stage(stage)
	if st == nil {
		t.Fatalf("Dockerfile: no stage %s", stage)
	}
	var files []string
	for _, c := range st.all("COPY") {
		f := strings.Fields(c.rest)
		files = append(files, f[len(f)-1])
	}
	return files
}

// TestRenderedManifests builds base and every overlay with kustomize,
// decodes the output strictly, and checks that the pieces fit each other
// and the binaries: addresses name Services that exist, ports agree,
// probes hit the endpoints the code serves, files come from ConfigMaps the
// way reloading needs, grace periods cover the shutdown timeouts.
func TestRenderedManifests(t *testing.T) {
	global := map[string]bool{} // the global group's advertised gRPC addresses
	gateways := 0
	var regional []rendering
	for _, dir := range overlays(t) {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			r := render(t, dir)
			if t.Failed() {
				return
			}
			adv := checkCoordinator(t, r)
			checkCertManager(t, r)
			checkCoordinatorCert(t, r, agentCoordinatorHosts(t, r))
			if get[*appsv1.Deployment](r, "gateway") != nil {
				gateways++
				checkGateway(t, r)
			}
			checkNetworkPolicies(t, r)
			if coordinatorEnv(t, r, 0)["RATION_UPSTREAM"] == "" {
				for _, a := range adv {
					global[a] = true
				}
			} else {
				regional = append(regional, r)
			}
		})
	}
	if gateways == 0 || len(regional) == 0 || len(global) == 0 {
		t.Fatalf("want at least one region's overlay (with a gateway and RATION_UPSTREAM) and the global group's; have %d gateways, %d regional groups, %d global addresses", gateways, len(regional), len(global))
	}
	// Every regional group leases from the global group's members.
	for _, r := range regional {
		for _, a := range strings.Split(coordinatorEnv(t, r, 0)["RATION_UPSTREAM"], ",") {
			if !global[a] {
				t.Errorf("%s: RATION_UPSTREAM names %s, which no global group member advertises (%v)", r.dir, a, sortedKeys(global))
			}
		}
	}
}

// coordinatorEnv is the environment of coordinator pod ordinal i.
func coordinatorEnv(t testing.TB, r rendering, i int) map[string]string {
	t.Helper()
	sts := get[*appsv1.StatefulSet](r, "coordinator")
	if sts == nil {
		t.Fatalf("%s: no StatefulSet coordinator", r.dir)
	}
	return env(t, sts.Spec.Template.Spec.Containers[0], map[string]string{
		"metadata.name": fmt.Sprintf("%s-%d", sts.Name, i), "metadata.namespace": sts.Namespace})
}

// checkCoordinator checks the coordinator group and returns the gRPC
// addresses its members advertise.
func checkCoordinator(t *testing.T, r rendering) []string {
	sts := get[*appsv1.StatefulSet](r, "coordinator")
	if sts == nil {
		t.Fatal("no StatefulSet coordinator")
	}
	var advertised []string
	ns := sts.Namespace
	if ns == "" || get[*corev1.Namespace](r, ns) == nil {
		t.Errorf("StatefulSet coordinator in namespace %q, which the rendering does not create", ns)
	}
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas != 3 {
		t.Errorf("replicas %v, want 3", sts.Spec.Replicas)
	}
	replicas := int(*sts.Spec.Replicas)
	tpl := sts.Spec.Template
	if !selects(sts.Spec.Selector.MatchLabels, tpl.Labels) {
		t.Errorf("selector %v does not select the template's labels %v", sts.Spec.Selector.MatchLabels, tpl.Labels)
	}

	// The governing Service lists only ready members: coordinator-launch
	// asks it whether a cluster exists.
	gov := get[*corev1.Service](r, sts.Spec.ServiceName)
	switch {
	case gov == nil:
		t.Errorf("serviceName %q: no such Service", sts.Spec.ServiceName)
	case gov.Spec.ClusterIP != corev1.ClusterIPNone:
		t.Errorf("Service %s: want headless (clusterIP: None)", gov.Name)
	case gov.Spec.PublishNotReadyAddresses:
		t.Errorf("Service %s publishes unready pods: coordinator-0 would take a starting peer for a live cluster", gov.Name)
	case !selects(gov.Spec.Selector, tpl.Labels):
		t.Errorf("Service %s does not select the coordinator pods", gov.Name)
	}

	if len(tpl.Spec.Containers) != 1 {
		t.Fatalf("want one container, have %d", len(tpl.Spec.Containers))
	}
	c := tpl.Spec.Containers[0]
	if !isImage(c.Image, "ration/coordinator") {
		t.Errorf("image %s: want [REGISTRY/]ration/coordinator (deploy/docker/Dockerfile, target coordinator)", c.Image)
	}
	files := dockerStageFiles(t, "coordinator")
	if len(c.Command) != 2 || !slices.Contains(files, c.Command[0]) || !slices.Contains(files, c.Command[1]) ||
		!strings.HasSuffix(c.Command[0], "coordinator-launch") {
		t.Errorf("command %q: want [coordinator-launch coordinator] as the image has them (%q)", c.Command, files)
	}
	if len(c.Args) > 0 {
		t.Errorf("args %q: configure with RATION_* variables only (coordinator-launch reads the environment)", c.Args)
	}

	ports := map[string]int{}
	for _, p := range c.Ports {
		ports[p.Name] = int(p.ContainerPort)
	}
	for i := range replicas {
		pod := fmt.Sprintf("%s-%d", sts.Name, i)
		e := env(t, c, map[string]string{"metadata.name": pod, "metadata.namespace": ns})
		if e["RATION_ID"] != pod {
			t.Errorf("%s: RATION_ID %q, want the pod name (stable Raft server id)", pod, e["RATION_ID"])
		}
		// Bind addresses match the declared container ports.
		for v, port := range map[string]string{"RATION_RAFT": "raft", "RATION_GRPC": "grpc", "RATION_HTTP": "http", "RATION_ADMIN": "admin"} {
			if _, p := hostPort(t, v, e[v]); p != ports[port] {
				t.Errorf("%s: %s %q, container port %s is %d", pod, v, e[v], port, ports[port])
			}
		}
		// Advertised addresses are the member's own Service: stable IP.
		// The global group's gRPC address is an external name instead,
		// served by the member's LoadBalancer Service.
		advertised = append(advertised, e["RATION_GRPC_ADVERTISE"])
		for v, port := range map[string]string{"RATION_RAFT_ADVERTISE": "raft", "RATION_GRPC_ADVERTISE": "grpc", "RATION_ADMIN_ADVERTISE": "admin"} {
			if h, _ := hostPort(t, v, e[v]); v == "RATION_GRPC_ADVERTISE" && !strings.HasSuffix(h, ".svc") {
				checkExternal(t, r, pod, e[v], tpl.Labels, c, ports[port])
				continue
			}
			svc := serviceFor(t, r, pod+" "+v, e[v], ns)
			if svc == nil {
				continue
			}
			if svc.Name != pod {
				t.Errorf("%s: %s %q: want the pod's own Service %s", pod, v, e[v], pod)
			}
			if !svc.Spec.PublishNotReadyAddresses {
				t.Errorf("Service %s: publishNotReadyAddresses must be true: Raft needs unready members", svc.Name)
			}
			if svc.Spec.ClusterIP == corev1.ClusterIPNone {
				t.Errorf("Service %s is headless: a pod IP changes on restart, Raft keeps the address", svc.Name)
			}
			if svc.Spec.Selector["statefulset.kubernetes.io/pod-name"] != pod || !selects(svc.Spec.Selector, withPodName(tpl.Labels, pod)) {
				t.Errorf("Service %s selects %v, want only pod %s", svc.Name, svc.Spec.Selector, pod)
			}
			_, p := hostPort(t, v, e[v])
			for _, sp := range svc.Spec.Ports {
				if int(sp.Port) == p && containerPort(c, sp.TargetPort) != ports[port] {
					t.Errorf("Service %s port %d targets %v, not the %s port", svc.Name, p, sp.TargetPort, port)
				}
			}
		}
		if svc := serviceFor(t, r, pod+" RATION_JOIN", e["RATION_JOIN"], ns); svc != nil && svc != gov {
			t.Errorf("%s: RATION_JOIN %q: want the governing Service %s (ready members only)", pod, e["RATION_JOIN"], gov.Name)
		} else if svc != nil {
			// A member joins through the admin API, which the lease port
			// does not serve.
			_, p := hostPort(t, "RATION_JOIN", e["RATION_JOIN"])
			for _, sp := range svc.Spec.Ports {
				if int(sp.Port) == p && containerPort(c, sp.TargetPort) != ports["admin"] {
					t.Errorf("%s: RATION_JOIN %q: Service %s port %d targets %v, not the admin port %d", pod, e["RATION_JOIN"], svc.Name, p, sp.TargetPort, ports["admin"])
				}
			}
		}
		if h, _ := hostPort(t, "RATION_ADMIN", e["RATION_ADMIN"]); e["RATION_ADMIN_ADVERTISE"] == "" || h == "127.0.0.1" {
			t.Errorf("%s: RATION_ADMIN %q, RATION_ADMIN_ADVERTISE %q: members join through each other's admin API, which must listen on the pod IP and be advertised", pod, e["RATION_ADMIN"], e["RATION_ADMIN_ADVERTISE"])
		}
		if _, ok := e["RATION_BOOTSTRAP"]; ok {
			t.Errorf("%s: RATION_BOOTSTRAP set: coordinator-launch chooses it from the ordinal", pod)
		}
	}
	e := env(t, c, map[string]string{"metadata.name": sts.Name + "-0", "metadata.namespace": ns})

	// Probes: the coordinator serves /readyz and /healthz on -http.
	probe(t, "coordinator readiness", c, c.ReadinessProbe, "/readyz", ports["http"])
	probe(t, "coordinator liveness", c, c.LivenessProbe, "/healthz", ports["http"])
	scrapeAnnotations(t, "coordinator", tpl, ports["http"], "coordinator")

	// The Raft data directory is on the claim, below its root (a fresh
	// volume may hold lost+found).
	var dataMount string
	for _, vct := range sts.Spec.VolumeClaimTemplates {
		for _, m := range c.VolumeMounts {
			if m.Name == vct.Name {
				dataMount = m.MountPath
			}
		}
	}
	if dataMount == "" {
		t.Error("no volumeClaimTemplate is mounted: Raft data would not survive a restart")
	} else if dd := e["RATION_DATA_DIR"]; !strings.HasPrefix(dd, dataMount+"/") {
		t.Errorf("RATION_DATA_DIR %q: want a directory below the persistent volume at %s", dd, dataMount)
	}
	mountedFile(t, r, tpl.Spec, c, e["RATION_RULES"], "ration-rules")

	// Graceful termination covers the leadership transfer and drain.
	grace := time.Duration(*tpl.Spec.TerminationGracePeriodSeconds) * time.Second
	if st := duration(t, "RATION_SHUTDOWN_TIMEOUT", e["RATION_SHUTDOWN_TIMEOUT"]); grace < st+5*time.Second {
		t.Errorf("terminationGracePeriodSeconds %v: want at least RATION_SHUTDOWN_TIMEOUT %v + 5s", grace, st)
	}
	checkSecurity(t, "coordinator", tpl.Spec, []corev1.Container{c}, true)
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Error("coordinator: want cpu and memory requests and a memory limit")
	}

	// One member at a time may be disrupted.
	var pdb *policyv1.PodDisruptionBudget
	for _, p := range all[*policyv1.PodDisruptionBudget](r) {
		if selects(p.Spec.Selector.MatchLabels, tpl.Labels) {
			pdb = p
		}
	}
	if pdb == nil {
		t.Error("no PodDisruptionBudget selects the coordinators")
	} else if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != (replicas-1)/2 {
		t.Errorf("PodDisruptionBudget maxUnavailable %v, want %d (a majority of %d stays up)", pdb.Spec.MaxUnavailable, (replicas-1)/2, replicas)
	}

	// A regional group names its region, the one its pods are labelled
	// with; the global group serves no region of its own.
	region := tpl.Labels["ration.dev/region"]
	if e["RATION_UPSTREAM"] != "" && e["RATION_REGION"] != region {
		t.Errorf("regional group: RATION_REGION %q, pod label ration.dev/region %q", e["RATION_REGION"], region)
	}
	if e["RATION_UPSTREAM"] == "" && e["RATION_REGION"] != "" {
		t.Errorf("global group: RATION_REGION %q set without RATION_UPSTREAM", e["RATION_REGION"])
	}
	return advertised
}

// checkExternal checks that addr is served by a LoadBalancer Service of
// pod, published under addr's host name.
func checkExternal(t *testing.T, r rendering, pod, addr string, podLabels map[string]string, c corev1.Container, port int) {
	t.Helper()
	host, p := hostPort(t, "external address", addr)
	for _, svc := range all[*corev1.Service](r) {
		if svc.Annotations["external-dns.alpha.kubernetes.io/hostname"] != host {
			continue
		}
		if svc.Spec.Type != corev1.ServiceTypeLoadBalancer || !svc.Spec.PublishNotReadyAddresses ||
			!selects(svc.Spec.Selector, withPodName(podLabels, pod)) || svc.Spec.Selector["statefulset.kubernetes.io/pod-name"] != pod {
			t.Errorf("Service %s (for %s): want a LoadBalancer selecting only pod %s, unready included", svc.Name, addr, pod)
		}
		if len(svc.Spec.LoadBalancerSourceRanges) == 0 {
			t.Errorf("Service %s exposes the lease port to every address: set loadBalancerSourceRanges", svc.Name)
		}
		for _, sp := range svc.Spec.Ports {
			if int(sp.Port) == p && containerPort(c, sp.TargetPort) == port {
				return
			}
		}
		t.Errorf("Service %s does not expose %s on the gRPC port", svc.Name, addr)
		return
	}
	t.Errorf("%s advertises %s, but no Service publishes that name (external-dns.alpha.kubernetes.io/hostname)", pod, addr)
}

func withPodName(l map[string]string, pod string) map[string]string {
	out := map[string]string{"statefulset.kubernetes.io/pod-name": pod}
	for k, v := range l {
		out[k] = v
	}
	return out
}

// isImage reports whether ref is repo, in any registry, with a tag.
func isImage(ref, repo string) bool {
	i := strings.LastIndex(ref, ":")
	if i < 0 || i == len(ref)-1 || strings.Contains(ref[i:], "/") {
		return false // no tag (a registry's port is not one)
	}
	name := ref[:i]
	return name == repo || strings.HasSuffix(name, "/"+repo)
}

func probe(t *testing.T, what string, c corev1.Container, p *corev1.Probe, path string, port int) {
	t.Helper()
	switch {
	case p == nil:
		t.Errorf("%s: no probe", what)
	case p.HTTPGet == nil:
		t.Errorf("%s: want an HTTP GET probe", what)
	case p.HTTPGet.Path != path:
		t.Errorf("%s: path %s, want %s", what, p.HTTPGet.Path, path)
	case containerPort(c, p.HTTPGet.Port) != port:
		t.Errorf("%s: port %v, want %d", what, p.HTTPGet.Port, port)
	}
}

// scrapeAnnotations checks the labels and annotations scrape.yml uses.
func scrapeAnnotations(t *testing.T, what string, tpl corev1.PodTemplateSpec, port int, component string) {
	t.Helper()
	a := tpl.Annotations
	if a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != strconv.Itoa(port) || a["prometheus.io/path"] != "/metrics" {
		t.Errorf("%s: prometheus.io annotations %v: want scrape true, port %d, path /metrics", what, a, port)
	}
	if tpl.Labels["ration.dev/component"] != component {
		t.Errorf("%s: label ration.dev/component %q, want %q", what, tpl.Labels["ration.dev/component"], component)
	}
	if tpl.Labels["ration.dev/region"] == "" {
		t.Errorf("%s: no ration.dev/region label: series would have no region", what)
	}
}

func checkSecurity(t *testing.T, what string, spec corev1.PodSpec, cs []corev1.Container, ours bool) {
	t.Helper()
	psc := spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Errorf("%s: want runAsNonRoot and a non-zero runAsUser", what)
	} else if ours && *psc.RunAsUser != 65532 {
		t.Errorf("%s: runAsUser %d, the image's USER is 65532", what, *psc.RunAsUser)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("%s: automountServiceAccountToken: want false (nothing here talks to the API server)", what)
	}
	for _, c := range cs {
		sc := c.SecurityContext
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("%s container %s: want allowPrivilegeEscalation false, readOnlyRootFilesystem, capabilities drop ALL", what, c.Name)
		}
	}
}

func checkGateway(t *testing.T, r rendering) {
	dep := get[*appsv1.Deployment](r, "gateway")
	if dep == nil {
		t.Fatal("no Deployment gateway")
	}
	tpl := dep.Spec.Template
	ns := dep.Namespace
	var agent *corev1.Container
	for i, c := range tpl.Spec.InitContainers {
		if c.Name == "gateway-agent" {
			agent = &tpl.Spec.InitContainers[i]
		}
	}
	if agent == nil {
		t.Fatal("gateway: no gateway-agent init container (native sidecar)")
	}
	if agent.RestartPolicy == nil || *agent.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Error("gateway-agent: want restartPolicy Always (a native sidecar: up before the gateway, down after it)")
	}
	if !isImage(agent.Image, "ration/gateway-agent") {
		t.Errorf("gateway-agent image %s: want [REGISTRY/]ration/gateway-agent", agent.Image)
	}
	if len(agent.Command) > 0 || len(agent.Args) > 0 {
		t.Errorf("gateway-agent: command %q args %q: the image's entrypoint and RATION_* variables only", agent.Command, agent.Args)
	}
	pod := dep.Name + "-abc12-xyz34"
	e := env(t, *agent, map[string]string{"metadata.name": pod, "metadata.namespace": ns})
	if e["RATION_AGENT_ID"] != pod {
		t.Errorf("RATION_AGENT_ID %q: want the pod name (unique lease holder id)", e["RATION_AGENT_ID"])
	}
	if region := tpl.Labels["ration.dev/region"]; e["RATION_REGION"] != region {
		t.Errorf("RATION_REGION %q but pod label ration.dev/region %q: metrics and leases would disagree on the region", e["RATION_REGION"], region)
	}
	if e["RATION_REGION"] == "" {
		t.Error("gateway-agent: RATION_REGION not set: it would run as region \"local\"")
	}
	checkAgentCert(t, r, dep, *agent, e, pod)
	if ce := coordinatorEnv(t, r, 0); ce["RATION_REGION"] != e["RATION_REGION"] {
		t.Errorf("gateway-agent region %q, its coordinators' %q", e["RATION_REGION"], ce["RATION_REGION"])
	}

	_, httpPort := hostPort(t, "RATION_HTTP", e["RATION_HTTP"])
	if containerPort(*agent, intstr.FromString("agent-http")) != httpPort {
		t.Errorf("RATION_HTTP %s: container port agent-http differs", e["RATION_HTTP"])
	}
	grpcHost, grpcPort := hostPort(t, "RATION_GRPC", e["RATION_GRPC"])
	if ip := net.ParseIP(grpcHost); ip == nil || !ip.IsLoopback() {
		t.Errorf("RATION_GRPC %s: the gateway reaches the agent over loopback; do not expose the decision API", e["RATION_GRPC"])
	}
	probe(t, "agent startup", *agent, agent.StartupProbe, "/healthz", httpPort)
	probe(t, "agent readiness", *agent, agent.ReadinessProbe, "/readyz", httpPort)
	probe(t, "agent liveness", *agent, agent.LivenessProbe, "/healthz", httpPort)
	scrapeAnnotations(t, "gateway", tpl, httpPort, "agent")
	mountedFile(t, r, tpl.Spec, *agent, e["RATION_RULES"], "ration-rules")
	for _, a := range strings.Split(e["RATION_COORDINATORS"], ",") {
		svc := serviceFor(t, r, "RATION_COORDINATORS", a, get[*appsv1.StatefulSet](r, "coordinator").Namespace)
		if svc != nil && !selects(svc.Spec.Selector, get[*appsv1.StatefulSet](r, "coordinator").Spec.Template.Labels) {
			t.Errorf("RATION_COORDINATORS %s: Service %s does not select the coordinators", a, svc.Name)
		}
	}
	for _, c := range append([]corev1.Container{*agent}, tpl.Spec.Containers...) {
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("gateway container %s: want cpu and memory requests and a memory limit", c.Name)
		}
	}
	checkSecurity(t, "gateway", tpl.Spec, append([]corev1.Container{*agent}, tpl.Spec.Containers...), false)

	// Envoy talks to the agent's gRPC port over loopback, and reads its
	// bootstrap from the ConfigMap.
	if len(tpl.Spec.Containers) != 1 {
		t.Fatalf("gateway: want one main container, have %d", len(tpl.Spec.Containers))
	}
	envoy := tpl.Spec.Containers[0]
	i := slices.Index(envoy.Args, "-c")
	if i < 0 || i+1 >= len(envoy.Args) {
		t.Fatalf("envoy args %q: no -c FILE", envoy.Args)
	}
	cm := ""
	for _, v := range tpl.Spec.Volumes {
		if v.ConfigMap != nil && strings.HasPrefix(v.ConfigMap.Name, "gateway-envoy") {
			cm = v.ConfigMap.Name
		}
	}
	bootstrap := mountedFile(t, r, tpl.Spec, envoy, envoy.Args[i+1], cm)
	if want := fmt.Sprintf("address: %s, port_value: %d", grpcHost, grpcPort); !strings.Contains(bootstrap, want) {
		t.Errorf("envoy bootstrap: no socket_address {%s}: the ration_agent cluster must point at RATION_GRPC", want)
	}
	envoyPort := containerPort(envoy, intstr.FromString("http"))
	if !strings.Contains(bootstrap, fmt.Sprintf("address: 0.0.0.0, port_value: %d", envoyPort)) {
		t.Errorf("envoy bootstrap: no listener on the container port %d", envoyPort)
	}

	// Termination: Envoy's preStop sleep, then the agent's shutdown, fit
	// in the grace period.
	grace := time.Duration(*tpl.Spec.TerminationGracePeriodSeconds) * time.Second
	var preStop time.Duration
	if envoy.Lifecycle != nil && envoy.Lifecycle.PreStop != nil && envoy.Lifecycle.PreStop.Sleep != nil {
		preStop = time.Duration(envoy.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	}
	if st := duration(t, "RATION_SHUTDOWN_TIMEOUT", e["RATION_SHUTDOWN_TIMEOUT"]); grace < preStop+st+5*time.Second {
		t.Errorf("terminationGracePeriodSeconds %v < preStop %v + agent RATION_SHUTDOWN_TIMEOUT %v + 5s", grace, preStop, st)
	}
	if dt := duration(t, "RATION_DECISION_TIMEOUT", e["RATION_DECISION_TIMEOUT"]); !strings.Contains(bootstrap, "timeout: ") {
		t.Error("envoy bootstrap: set the rate-limit filter's timeout above RATION_DECISION_TIMEOUT")
	} else if m := regexp.MustCompile(`(?m)^\s+timeout: (\S+)$`).FindStringSubmatch(bootstrap); m == nil {
		t.Error("envoy bootstrap: rate-limit filter timeout not found")
	} else if et := duration(t, "envoy rate-limit timeout", m[1]); et <= dt {
		t.Errorf("envoy rate-limit timeout %v <= RATION_DECISION_TIMEOUT %v: Envoy would give up before the agent's failure policy answers", et, dt)
	}

	// The Service routes to Envoy.
	svc := get[*corev1.Service](r, "gateway")
	if svc == nil || !selects(svc.Spec.Selector, tpl.Labels) {
		t.Error("Service gateway missing or not selecting the gateway pods")
	} else if containerPort(envoy, svc.Spec.Ports[0].TargetPort) != envoyPort {
		t.Errorf("Service gateway targets %v, not Envoy's port %d", svc.Spec.Ports[0].TargetPort, envoyPort)
	}
}

func checkNetworkPolicies(t *testing.T, r rendering) {
	sts := get[*appsv1.StatefulSet](r, "coordinator")
	dep := get[*appsv1.Deployment](r, "gateway")
	if sts == nil || dep == nil {
		return
	}
	// Which ports each pod set admits from whom.
	admits := func(target, from map[string]string, port int) bool {
		for _, np := range all[*networkingv1.NetworkPolicy](r) {
			if !selects(np.Spec.PodSelector.MatchLabels, target) {
				continue
			}
			for _, rule := range np.Spec.Ingress {
				fromOK := len(rule.From) == 0
				for _, f := range rule.From {
					if f.PodSelector != nil && f.NamespaceSelector == nil && selects(f.PodSelector.MatchLabels, from) {
						fromOK = true
					}
				}
				portOK := len(rule.Ports) == 0
				for _, p := range rule.Ports {
					portOK = portOK || p.Port != nil && p.Port.IntValue() == port
				}
				if fromOK && portOK {
					return true
				}
			}
		}
		return false
	}
	coord, gw := sts.Spec.Template.Labels, dep.Spec.Template.Labels
	stranger := map[string]string{"app": "something-else"}
	operator := map[string]string{"ration.dev/operator": "true"}
	for _, tc := range []struct {
		what         string
		target, from map[string]string
		port         int
		want         bool
	}{
		{"coordinator raft from coordinator", coord, coord, 8300, true},
		{"coordinator grpc from agents", coord, gw, 8301, true},
		{"coordinator grpc from any pod", coord, stranger, 8301, false},
		{"coordinator raft from agents", coord, gw, 8300, false},
		{"coordinator raft from operators", coord, operator, 8300, false},
		// The admin API: members (joining) and operators, never gateways.
		{"coordinator admin from coordinator", coord, coord, 8303, true},
		{"coordinator admin from operators", coord, operator, 8303, true},
		{"coordinator admin from agents", coord, gw, 8303, false},
		{"coordinator admin from any pod", coord, stranger, 8303, false},
		{"gateway traffic from any pod", gw, stranger, 8000, true},
		{"agent API from any pod", gw, stranger, 8080, false},
	} {
		if got := admits(tc.target, tc.from, tc.port); got != tc.want {
			t.Errorf("NetworkPolicy: %s (port %d): admitted %v, want %v", tc.what, tc.port, got, tc.want)
		}
	}
}

// manifestRules returns the rules file of every rendering, by directory.
func manifestRules(t testing.TB) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, dir := range overlays(t) {
		r := render(t, dir)
		cm := get[*corev1.ConfigMap](r, "ration-rules")
		if cm == nil {
			t.Fatalf("%s: no ConfigMap ration-rules", dir)
		}
		out[dir] = cm.Data["rules.yaml"]
	}
	return out
}

// sortedKeys is for stable test output.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// agentCoordinatorHosts are the hosts the rendering's agents dial the
// coordinators at (RATION_COORDINATORS): the coordinators' certificates
// must name them.
func agentCoordinatorHosts(t testing.TB, r rendering) []string {
	t.Helper()
	var out []string
	for _, dep := range all[*appsv1.Deployment](r) {
		for _, c := range dep.Spec.Template.Spec.InitContainers {
			if c.Name != "gateway-agent" {
				continue
			}
			e := env(t, c, map[string]string{"metadata.name": dep.Name + "-abc12-xyz34", "metadata.namespace": dep.Namespace})
			for _, a := range strings.Split(e["RATION_COORDINATORS"], ",") {
				h, _ := hostPort(t, "RATION_COORDINATORS", a)
				out = append(out, h)
			}
		}
	}
	return out
}
