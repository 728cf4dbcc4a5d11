package deploy

import (
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// cert-manager.io/v1 Issuer and Certificate, with the fields of its API
// that these manifests use (https://cert-manager.io/docs/reference/api-docs/):
// a subset, so that strict decoding refuses a misspelt field; add a field
// here, checked against that reference, before using it in a manifest.
// The deploy module takes no dependency on cert-manager's own module for
// two kinds.

var certManagerGV = schema.GroupVersion{Group: "cert-manager.io", Version: "v1"}

func addCertManager(s *runtime.Scheme) error {
	s.AddKnownTypeWithName(certManagerGV.WithKind("Issuer"), &cmIssuer{})
	s.AddKnownTypeWithName(certManagerGV.WithKind("Certificate"), &cmCertificate{})
	return nil
}

type cmIssuer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              cmIssuerSpec `json:"spec"`
}

type cmIssuerSpec struct {
	CA         *cmCAIssuer `json:"ca,omitempty"`
	SelfSigned *struct{}   `json:"selfSigned,omitempty"`
}

type cmCAIssuer struct {
	SecretName string `json:"secretName"`
}

type cmCertificate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              cmCertificateSpec `json:"spec"`
}

type cmCertificateSpec struct {
	SecretName  string        `json:"secretName"`
	IssuerRef   cmIssuerRef   `json:"issuerRef"`
	IsCA        bool          `json:"isCA,omitempty"`
	CommonName  string        `json:"commonName,omitempty"`
	DNSNames    []string      `json:"dnsNames,omitempty"`
	URIs        []string      `json:"uris,omitempty"`
	Usages      []string      `json:"usages,omitempty"`
	Duration    string        `json:"duration,omitempty"`
	RenewBefore string        `json:"renewBefore,omitempty"`
	PrivateKey  *cmPrivateKey `json:"privateKey,omitempty"`
}

type cmIssuerRef struct {
	Name  string `json:"name"`
	Kind  string `json:"kind,omitempty"`
	Group string `json:"group,omitempty"`
}

type cmPrivateKey struct {
	Algorithm      string `json:"algorithm,omitempty"`
	Size           int    `json:"size,omitempty"`
	RotationPolicy string `json:"rotationPolicy,omitempty"`
}

func (o *cmIssuer) DeepCopyObject() runtime.Object      { return deepCopy(o) }
func (o *cmCertificate) DeepCopyObject() runtime.Object { return deepCopy(o) }

func deepCopy[T any](o *T) *T {
	b, err := json.Marshal(o)
	if err != nil {
		panic(err)
	}
	out := new(T)
	if err := json.Unmarshal(b, out); err != nil {
		panic(err)
	}
	return out
}

// csiDriver is cert-manager's csi-driver: a pod volume of this driver is a
// certificate issued for that pod (https://cert-manager.io/docs/usage/csi-driver/).
const csiDriver = "csi.cert-manager.io"

// podCert is the certificate a pod template asks csi-driver for, its
// attributes with ${POD_NAME} and ${POD_NAMESPACE} filled in for one pod.
type podCert struct {
	volume, mount string // the volume's name, and where the container mounts it
	attrs         map[string]string
}

func (p podCert) list(key string) []string {
	var out []string
	for _, v := range strings.Split(p.attrs["csi.cert-manager.io/"+key], ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// tlsCert checks that container c of spec reads its TLS files
// (RATION_TLS_CERT, _KEY, _CA in e) from a csi-driver volume, issued by an
// Issuer of the rendering and readable by the pod's user, with no
// RATION_INSECURE beside them, and returns that volume's certificate for
// pod in namespace ns.
func tlsCert(t *testing.T, r rendering, what string, spec corev1.PodSpec, c corev1.Container, e map[string]string, pod, ns string) podCert {
	t.Helper()
	if v, ok := e["RATION_INSECURE"]; ok {
		t.Errorf("%s: RATION_INSECURE=%s: the manifests run mutual TLS (docs/security.md)", what, v)
	}
	var pc podCert
	for _, k := range []string{"RATION_TLS_CERT", "RATION_TLS_KEY", "RATION_TLS_CA"} {
		f := e[k]
		if f == "" {
			t.Errorf("%s: %s not set", what, k)
			continue
		}
		var found bool
		for _, m := range c.VolumeMounts {
			if filepath.Dir(f) != m.MountPath {
				continue
			}
			for _, v := range spec.Volumes {
				if v.Name != m.Name {
					continue
				}
				if v.CSI == nil || v.CSI.Driver != csiDriver {
					t.Errorf("%s: %s %s is on volume %s, not a %s volume", what, k, f, v.Name, csiDriver)
					continue
				}
				if v.CSI.ReadOnly == nil || !*v.CSI.ReadOnly || !m.ReadOnly {
					t.Errorf("%s: volume %s: csi-driver volumes are read-only (readOnly: true on the volume and the mount)", what, v.Name)
				}
				found = true
				pc = podCert{volume: v.Name, mount: m.MountPath, attrs: map[string]string{}}
				for ak, av := range v.CSI.VolumeAttributes {
					pc.attrs[ak] = strings.NewReplacer("${POD_NAME}", pod, "${POD_NAMESPACE}", ns).Replace(av)
				}
			}
		}
		if !found {
			t.Errorf("%s: %s %s: not in a csi-driver volume the container mounts", what, k, f)
		}
		// The file names csi-driver writes, unless the volume names others.
		want := map[string]string{"RATION_TLS_CERT": "tls.crt", "RATION_TLS_KEY": "tls.key", "RATION_TLS_CA": "ca.crt"}[k]
		attr := map[string]string{"RATION_TLS_CERT": "certificate-file", "RATION_TLS_KEY": "privatekey-file", "RATION_TLS_CA": "ca-file"}[k]
		if v := pc.attrs["csi.cert-manager.io/"+attr]; v != "" {
			want = v
		}
		if found && filepath.Base(f) != want {
			t.Errorf("%s: %s %s: csi-driver writes %s", what, k, f, want)
		}
	}
	if pc.attrs == nil {
		return pc
	}
	kind := pc.attrs["csi.cert-manager.io/issuer-kind"]
	if kind == "" {
		kind = "Issuer"
	}
	name := pc.attrs["csi.cert-manager.io/issuer-name"]
	if iss := get[*cmIssuer](r, name); kind != "Issuer" || iss == nil || iss.Spec.CA == nil {
		t.Errorf("%s: volume %s: issuer %s %q: want a CA Issuer of the rendering", what, pc.volume, kind, name)
	}
	// The files belong to root and the group fs-group: the pod's group
	// must be it, or the process cannot read its key.
	group := spec.SecurityContext.RunAsGroup
	if fg := pc.attrs["csi.cert-manager.io/fs-group"]; group == nil || fg != fmt.Sprint(*group) {
		t.Errorf("%s: volume %s: fs-group %q, want the pod's runAsGroup %v (else the key is unreadable)", what, pc.volume, fg, group)
	}
	for _, k := range []string{"duration", "renew-before"} {
		if _, err := time.ParseDuration(pc.attrs["csi.cert-manager.io/"+k]); err != nil {
			t.Errorf("%s: volume %s: %s: %v", what, pc.volume, k, err)
		}
	}
	if !slices.Contains(pc.list("key-usages"), "client auth") {
		t.Errorf("%s: volume %s: key-usages %v: every Ration process is a TLS client (client auth)", what, pc.volume, pc.list("key-usages"))
	}
	return pc
}

// checkCoordinatorCert: every coordinator pod's certificate names its
// group and Raft id (ration://coordinator/<group>/<RATION_ID>, the group
// its RATION_REGION, or global without one: what the coordinator checks
// its own certificate against, and its peers check it against) and, in a
// regional group, its
// region (ration://region/<RATION_REGION>: its leader leases from the
// global group as that region), and carries every host it is dialed by:
// its advertised Raft, lease and admin addresses, the Service members join
// through, the Services agents list.
func checkCoordinatorCert(t *testing.T, r rendering, hosts []string) {
	sts := get[*appsv1.StatefulSet](r, "coordinator")
	c := sts.Spec.Template.Spec.Containers[0]
	for i := range int(*sts.Spec.Replicas) {
		pod := fmt.Sprintf("%s-%d", sts.Name, i)
		e := coordinatorEnv(t, r, i)
		pc := tlsCert(t, r, pod, sts.Spec.Template.Spec, c, e, pod, sts.Namespace)
		if pc.attrs == nil {
			continue
		}
		group := e["RATION_REGION"]
		if group == "" {
			group = "global"
		}
		want := []string{"ration://coordinator/" + group + "/" + e["RATION_ID"]}
		if e["RATION_UPSTREAM"] != "" {
			want = append(want, "ration://region/"+e["RATION_REGION"])
		}
		if got := pc.list("uri-sans"); !slices.Equal(got, want) {
			t.Errorf("%s: certificate URI SANs %v, want %v", pod, got, want)
		}
		dialed := slices.Clone(hosts)
		for _, k := range []string{"RATION_RAFT_ADVERTISE", "RATION_GRPC_ADVERTISE", "RATION_ADMIN_ADVERTISE", "RATION_JOIN"} {
			h, _ := hostPort(t, k, e[k])
			dialed = append(dialed, h)
		}
		for _, h := range dialed {
			if net.ParseIP(h) != nil || !slices.Contains(pc.list("dns-names"), h) {
				t.Errorf("%s: certificate DNS names %v lack %s, which it is dialed by: the dialer would refuse it", pod, pc.list("dns-names"), h)
			}
		}
		if !slices.Contains(pc.list("key-usages"), "server auth") {
			t.Errorf("%s: key-usages %v: a coordinator serves TLS (server auth)", pod, pc.list("key-usages"))
		}
	}
}

// checkAgentCert: the gateway-agent's certificate names exactly the holder
// it renews leases as, ration://agent/<RATION_AGENT_ID>.
func checkAgentCert(t *testing.T, r rendering, dep *appsv1.Deployment, agent corev1.Container, e map[string]string, pod string) {
	pc := tlsCert(t, r, "gateway-agent", dep.Spec.Template.Spec, agent, e, pod, dep.Namespace)
	if pc.attrs == nil {
		return
	}
	if got, want := pc.list("uri-sans"), []string{"ration://agent/" + e["RATION_AGENT_ID"]}; !slices.Equal(got, want) {
		t.Errorf("gateway-agent: certificate URI SANs %v, want %v (its -id: every renewal is refused otherwise)", got, want)
	}
}

// checkCertManager: the operators' Certificate is a client certificate of
// the rendering's Issuer naming operators only, short-lived.
func checkCertManager(t *testing.T, r rendering) {
	iss := get[*cmIssuer](r, "ration-ca")
	if iss == nil || iss.Spec.CA == nil || iss.Spec.CA.SecretName == "" {
		t.Fatal("no CA Issuer ration-ca")
	}
	var ops int
	for _, c := range all[*cmCertificate](r) {
		s := c.Spec
		if s.IssuerRef.Name != iss.Name || s.IssuerRef.Kind != "Issuer" {
			t.Errorf("Certificate %s: issuer %v, want Issuer %s", c.Name, s.IssuerRef, iss.Name)
		}
		if len(s.URIs) == 0 {
			t.Errorf("Certificate %s names no identity (URI SAN ration://<role>/<name>)", c.Name)
		}
		for _, u := range s.URIs {
			if !strings.HasPrefix(u, "ration://operator/") {
				t.Errorf("Certificate %s: URI SAN %s: only operators have Certificates; pods get theirs from csi-driver", c.Name, u)
			}
		}
		ops++
		if len(s.DNSNames) > 0 || !slices.Contains(s.Usages, "client auth") || slices.Contains(s.Usages, "server auth") {
			t.Errorf("Certificate %s: DNS names %v, usages %v: an operator's is a client certificate", c.Name, s.DNSNames, s.Usages)
		}
		d, err1 := time.ParseDuration(s.Duration)
		rb, err2 := time.ParseDuration(s.RenewBefore)
		if err1 != nil || err2 != nil || rb >= d || d > 7*24*time.Hour {
			t.Errorf("Certificate %s: duration %q, renewBefore %q: want a short-lived certificate (at most 7 days) renewed before it ends", c.Name, s.Duration, s.RenewBefore)
		}
		if s.PrivateKey == nil || s.PrivateKey.RotationPolicy != "Always" {
			t.Errorf("Certificate %s: privateKey.rotationPolicy: want Always (a new key at each renewal)", c.Name)
		}
	}
	if ops == 0 {
		t.Error("no operator Certificate: the admin API needs ration://operator/<name>")
	}
}

// TestCertManagerCA: the CA bootstrap (applied once, not by the overlays)
// makes the secret the Issuer signs with, and keeps its key on renewal.
func TestCertManagerCA(t *testing.T) {
	r := render(t, filepath.Join(kubeDir, "cert-manager", "ca"))
	ca := get[*cmCertificate](r, "ration-ca")
	if ca == nil || !ca.Spec.IsCA {
		t.Fatal("no CA Certificate ration-ca")
	}
	self := get[*cmIssuer](r, ca.Spec.IssuerRef.Name)
	if self == nil || self.Spec.SelfSigned == nil {
		t.Errorf("Certificate ration-ca: issuer %q, want the self-signed Issuer of the kustomization", ca.Spec.IssuerRef.Name)
	}
	base := render(t, filepath.Join(kubeDir, "cert-manager"))
	if iss := get[*cmIssuer](base, "ration-ca"); iss == nil || iss.Spec.CA == nil || iss.Spec.CA.SecretName != ca.Spec.SecretName {
		t.Errorf("the Issuer ration-ca does not sign with the secret %s the CA bootstrap makes", ca.Spec.SecretName)
	}
	if ca.Spec.PrivateKey == nil || ca.Spec.PrivateKey.RotationPolicy != "Never" {
		t.Error("Certificate ration-ca: privateKey.rotationPolicy: want Never (a renewed CA keeps its key, so what it issued still chains)")
	}
}
