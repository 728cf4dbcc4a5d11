package main

import (
	"bytes"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ration-dev/ration/internal/tlsfiles"
)

// The files it writes load as TLS material and carry the identities asked
// for.
func TestWritesLoadablePKI(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	if err := run([]string{"-out", dir, "-coordinators", "n1,n2,u1@us", "-region", "eu", "-agents", "gw-1", "-operators", "ops"}, &out); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		file string
		role tlsfiles.Role
		name string
	}{
		{"coordinator-n1", tlsfiles.RoleCoordinator, "eu/n1"},
		{"coordinator-n2", tlsfiles.RoleRegion, "eu"},
		{"coordinator-u1", tlsfiles.RoleCoordinator, "us/u1"},
		{"coordinator-u1", tlsfiles.RoleRegion, "us"},
		{"agent-gw-1", tlsfiles.RoleAgent, "gw-1"},
		{"operator-ops", tlsfiles.RoleOperator, "ops"},
		{"gateway-dev", tlsfiles.RoleGateway, "dev"},
	} {
		src, err := tlsfiles.Open(tlsfiles.Files{Cert: filepath.Join(dir, tc.file+".crt"), Key: filepath.Join(dir, tc.file+".key"), CA: filepath.Join(dir, "ca.crt")}, tlsfiles.Options{})
		if err != nil {
			t.Fatalf("%s: %v", tc.file, err)
		}
		if !tlsfiles.Has(src.Leaf(), tc.role, tc.name) {
			t.Errorf("%s does not name %s", tc.file, tlsfiles.URI(tc.role, tc.name))
		}
		src.Close()
	}
}

// id@region names that node's region only; a malformed entry is refused,
// naming it.
func TestCoordinatorRegions(t *testing.T) {
	dir := t.TempDir()
	if err := run([]string{"-out", dir, "-coordinators", "g0,eu-0@eu", "-agents", "", "-operators", ""}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string][]string{"coordinator-g0": nil, "coordinator-eu-0": {"eu"}} {
		src, err := tlsfiles.Open(tlsfiles.Files{Cert: filepath.Join(dir, file+".crt"), Key: filepath.Join(dir, file+".key"), CA: filepath.Join(dir, "ca.crt")}, tlsfiles.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if got := tlsfiles.Names(src.Leaf(), tlsfiles.RoleRegion); len(got) != len(want) || (len(want) > 0 && got[0] != want[0]) {
			t.Errorf("%s names regions %q, want %q", file, got, want)
		}
		group := tlsfiles.GlobalGroup
		if len(want) > 0 {
			group = want[0]
		}
		if got := tlsfiles.Members(src.Leaf()); len(got) != 1 || got[0].Group != group {
			t.Errorf("%s names coordinators %v, want one of group %q", file, got, group)
		}
		src.Close()
	}
	for _, bad := range []string{"@eu", "n1@"} {
		err := run([]string{"-out", t.TempDir(), "-coordinators", bad}, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("-coordinators %q: %v, want refused naming it", bad, err)
		}
	}
}

// Run again over a PKI whose files were left world-readable (copied,
// extracted, chmod'ed), it writes every key 0600 and every certificate
// 0644, whatever the files there had.
func TestKeysArePrivateOverOldFiles(t *testing.T) {
	dir := t.TempDir()
	key, crt := filepath.Join(dir, "agent-gw-1.key"), filepath.Join(dir, "agent-gw-1.crt")
	for _, p := range []string{key, crt, filepath.Join(dir, "ca.crt")} {
		if err := os.WriteFile(p, []byte("old\n"), 0o666); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, 0o666); err != nil {
			t.Fatal(err)
		}
	}
	if err := run([]string{"-out", dir, "-coordinators", "n1", "-agents", "gw-1", "-operators", "ops"}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		want := os.FileMode(0o644)
		if strings.HasSuffix(e.Name(), ".key") {
			want = 0o600
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s has mode %v, want %v", e.Name(), fi.Mode().Perm(), want)
		}
	}
	if b, err := os.ReadFile(key); err != nil || !bytes.Contains(b, []byte("PRIVATE KEY")) {
		t.Errorf("%s was not rewritten: %v %q", key, err, b)
	}
}

// The CA is kept (its key 0600, with a warning), so that -add issues one
// more certificate from it later: only the one named, chaining to the
// ca.crt the running processes already trust, which stays as it was. A
// run without -add over a kept CA is refused and changes nothing, and a
// CA whose key is not its certificate's is refused by -add.
func TestAddIssuesFromTheKeptCA(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	if err := run([]string{"-out", dir, "-coordinators", "n1", "-agents", "a1", "-operators", "ops"}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "ca.key  the CA's private key (mode 0600): WARNING: whoever reads it can issue any identity") {
		t.Errorf("no warning about the kept CA key:\n%s", out.String())
	}
	caPath, keyPath := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	if fi, err := os.Stat(keyPath); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("ca.key: %v, %v; want mode 0600", fi, err)
	}
	caBefore, _ := os.ReadFile(caPath)
	keyBefore, _ := os.ReadFile(keyPath)
	before, _ := os.ReadDir(dir)

	err := run([]string{"-out", dir}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "holds a CA already") || !strings.Contains(err.Error(), "-add") {
		t.Fatalf("a second run without -add: %v, want refused naming -add", err)
	}
	if b, _ := os.ReadFile(keyPath); !bytes.Equal(b, keyBefore) {
		t.Fatal("the refused run replaced ca.key")
	}

	out.Reset()
	if err := run([]string{"-out", dir, "-add", "-agents", "a2", "-coordinators", "eu-0@eu"}, &out); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "WARNING") {
		t.Errorf("-add repeated the new CA's warning:\n%s", out.String())
	}
	after, _ := os.ReadDir(dir)
	if got, want := len(after), len(before)+4; got != want {
		t.Errorf("-add -agents a2 -coordinators eu-0@eu: %d files, want %d (two certificates and keys more, nothing from the defaults)", got, want)
	}
	if b, _ := os.ReadFile(caPath); !bytes.Equal(b, caBefore) {
		t.Error("-add changed ca.crt")
	}
	if b, _ := os.ReadFile(keyPath); !bytes.Equal(b, keyBefore) {
		t.Error("-add changed ca.key")
	}
	for file, want := range map[string]struct {
		role tlsfiles.Role
		name string
	}{"agent-a2": {tlsfiles.RoleAgent, "a2"}, "coordinator-eu-0": {tlsfiles.RoleRegion, "eu"}} {
		// Loaded against the ca.crt of the first run: what a process
		// started before -add verifies it with.
		src, err := tlsfiles.Open(tlsfiles.Files{Cert: filepath.Join(dir, file+".crt"), Key: filepath.Join(dir, file+".key"), CA: caPath}, tlsfiles.Options{})
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(caBefore)
		if _, err := src.Leaf().Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			t.Errorf("%s does not chain to the first run's CA: %v", file, err)
		}
		if !tlsfiles.Has(src.Leaf(), want.role, want.name) {
			t.Errorf("%s does not name %s", file, tlsfiles.URI(want.role, want.name))
		}
		src.Close()
	}

	if err := run([]string{"-out", dir, "-add"}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "name the certificates") {
		t.Errorf("-add naming nothing: %v, want refused", err)
	}
	if err := run([]string{"-out", t.TempDir(), "-add", "-agents", "a3"}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "ca.crt") {
		t.Errorf("-add without a kept CA: %v, want refused naming ca.crt", err)
	}
	other := t.TempDir()
	if err := run([]string{"-out", other, "-agents", "", "-operators", "", "-gateways", "", "-coordinators", ""}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	otherKey, _ := os.ReadFile(filepath.Join(other, "ca.key"))
	if err := os.WriteFile(keyPath, otherKey, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := run([]string{"-out", dir, "-add", "-agents", "a3"}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "is not the key of") {
		t.Errorf("-add with another CA's key: %v, want refused", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "agent-a3.crt")); err == nil {
		t.Error("-add with another CA's key wrote a certificate")
	}
}
