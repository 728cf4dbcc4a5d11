package main

import (
	"bytes"
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
