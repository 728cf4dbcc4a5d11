package main

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/ration-dev/ration/internal/tlsfiles"
)

// The files it writes load as TLS material and carry the identities asked
// for.
func TestWritesLoadablePKI(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	if err := run([]string{"-out", dir, "-coordinators", "n1,n2", "-region", "eu", "-agents", "gw-1", "-operators", "ops"}, &out); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		file string
		role tlsfiles.Role
		name string
	}{
		{"coordinator-n1", tlsfiles.RoleCoordinator, "n1"},
		{"coordinator-n2", tlsfiles.RoleRegion, "eu"},
		{"agent-gw-1", tlsfiles.RoleAgent, "gw-1"},
		{"operator-ops", tlsfiles.RoleOperator, "ops"},
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
