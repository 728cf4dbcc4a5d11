package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/tlsfiles"
)

// A node started from the command line with -tls-cert, -tls-key and
// -tls-ca serves the operator commands on its admin listener over mutual
// TLS only: with an operator certificate they work; with an agent's, in
// plaintext, or at the lease port, they are refused.
func TestCommandsOverMutualTLS(t *testing.T) {
	pki := harness.NewPKI(t)
	node := pki.Member(tlsfiles.GlobalGroup, "n1")
	dir := t.TempDir()
	rulesFile := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesFile, devRules, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr harness.LogBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-id", "n1", "-bootstrap", "-data-dir", filepath.Join(dir, "data"), "-rules", rulesFile,
			"-raft", "127.0.0.1:0", "-grpc", "127.0.0.1:0", "-admin", "127.0.0.1:0", "-http", "",
			"-tls-cert", node.Cert, "-tls-key", node.Key, "-tls-ca", node.CA}, &bytes.Buffer{}, &stderr, noEnv)
	}()
	re := regexp.MustCompile(`coordinator started.* grpc_addr=(\S+) .*admin_addr=(\S+)`)
	var addr, leaseAddr string
	deadline := time.Now().Add(30 * time.Second)
	for addr == "" {
		if m := re.FindStringSubmatch(stderr.String()); m != nil {
			addr, leaseAddr = m[2], m[1]
		}
		select {
		case err := <-done:
			t.Fatalf("coordinator exited: %v\n%s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("coordinator did not start:\n%s", stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(stderr.String(), "TLS material loaded") || strings.Contains(stderr.String(), "PLAINTEXT") {
		t.Fatalf("start-up log does not show TLS:\n%s", stderr.String())
	}
	ops := pki.Operator("ops")
	opFlags := []string{"-tls-cert", ops.Cert, "-tls-key", ops.Key, "-tls-ca", ops.CA}
	var out bytes.Buffer
	for {
		out.Reset()
		if err := run(ctx, append([]string{"status", "-addr", addr}, opFlags...), &out, &bytes.Buffer{}, noEnv); err != nil {
			t.Fatalf("status with an operator certificate: %v", err)
		}
		if strings.Contains(out.String(), "Leader") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status never showed a leader:\n%s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	out.Reset()
	if err := run(ctx, append([]string{"tune", "-addr", addr, "-rule", "export-global", "-max-slice", "7"}, opFlags...), &out, &bytes.Buffer{}, noEnv); err != nil {
		t.Fatalf("tune with an operator certificate: %v", err)
	}
	ag := pki.Agent("a1")
	err := run(ctx, []string{"tune", "-addr", addr, "-rule", "export-global", "-max-slice", "9", "-tls-cert", ag.Cert, "-tls-key", ag.Key, "-tls-ca", ag.CA}, &out, &bytes.Buffer{}, noEnv)
	if err == nil || !strings.Contains(err.Error(), "PermissionDenied") {
		t.Errorf("tune with an agent's certificate: %v, want PermissionDenied", err)
	}
	err = run(ctx, []string{"status", "-addr", addr, "-timeout", "2s"}, &out, &bytes.Buffer{}, noEnv)
	if err == nil {
		t.Error("status in plaintext against a TLS node succeeded")
	} else if !strings.Contains(err.Error(), "hint: the node closed the connection at once, as a node with TLS does to a plaintext client: pass an operator's certificate with -tls-cert") {
		t.Errorf("status in plaintext against a TLS node: %v, want a hint naming -tls-cert", err)
	}
	err = run(ctx, append([]string{"tune", "-addr", leaseAddr, "-rule", "export-global", "-max-slice", "9"}, opFlags...), &out, &bytes.Buffer{}, noEnv)
	if err == nil || !strings.Contains(err.Error(), "Unimplemented") {
		t.Errorf("tune at the lease port with an operator certificate: %v, want Unimplemented", err)
	}
	// -tls-server-name: the certificate is verified against it rather
	// than -addr's host (kubectl port-forward dials 127.0.0.1).
	if err := run(ctx, append([]string{"status", "-addr", addr, "-tls-server-name", "localhost"}, opFlags...), &out, &bytes.Buffer{}, noEnv); err != nil {
		t.Errorf("status with -tls-server-name localhost (a name the certificate carries): %v", err)
	}
	err = run(ctx, append([]string{"status", "-addr", addr, "-timeout", "2s", "-tls-server-name", "coordinator-0.ration.svc"}, opFlags...), &out, &bytes.Buffer{}, noEnv)
	if err == nil || !strings.Contains(err.Error(), "coordinator-0.ration.svc") {
		t.Errorf("status with -tls-server-name naming another host: %v, want the certificate refused for that name", err)
	}
	out.Reset()
	if err := run(ctx, append([]string{"tunings", "-addr", addr}, opFlags...), &out, &bytes.Buffer{}, noEnv); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`export-global\s+-\s+-\s+-\s+-\s+7\s+-`).MatchString(out.String()) {
		t.Errorf("tunings %q: want max slice 7 (the operator's), not 9", out.String())
	}
	cancel()
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("coordinator returned %v on shutdown", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("coordinator did not stop")
	}
}

// Plaintext only by choice: without TLS files and without -insecure the
// node refuses to start, naming both ways out; with -insecure it starts
// and says so as a warning; TLS files and -insecure together, or a partial
// set of files, are refused.
func TestPlaintextOnlyByChoice(t *testing.T) {
	dir := t.TempDir()
	rulesFile := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesFile, devRules, 0o644); err != nil {
		t.Fatal(err)
	}
	base := []string{"-id", "n1", "-bootstrap", "-rules", rulesFile, "-raft", "127.0.0.1:0", "-grpc", "127.0.0.1:0", "-admin", "127.0.0.1:0", "-http", ""}
	var stderr bytes.Buffer
	// Bounded: a node that started after all would run until then.
	refusedCtx, cancelRefused := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancelRefused()
	err := run(refusedCtx, append(append([]string{}, base...), "-data-dir", t.TempDir()), &bytes.Buffer{}, &stderr, noEnv)
	if err == nil || !strings.Contains(err.Error(), "no TLS files: set -tls-cert, -tls-key, -tls-ca (docs/security.md), or -insecure to run in plaintext") {
		t.Errorf("no TLS files and no -insecure: %v, want the node refused naming -tls-cert and -insecure", err)
	}
	if strings.Contains(stderr.String(), "coordinator started") {
		t.Errorf("the refused node started:\n%s", stderr.String())
	}
	pki := harness.NewPKI(t)
	f := pki.Member(tlsfiles.GlobalGroup, "n1")
	for _, tc := range []struct {
		name  string
		extra []string
		want  string
	}{
		{"insecure", []string{"-insecure"}, `level=WARN msg="PLAINTEXT by -insecure`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			var stderr harness.LogBuffer
			done := make(chan error, 1)
			args := append(append(append([]string{}, base...), "-data-dir", t.TempDir()), tc.extra...)
			go func() { done <- run(ctx, args, &bytes.Buffer{}, &stderr, noEnv) }()
			deadline := time.Now().Add(30 * time.Second)
			for !strings.Contains(stderr.String(), "coordinator started") {
				if time.Now().After(deadline) {
					t.Fatalf("no start:\n%s", stderr.String())
				}
				time.Sleep(10 * time.Millisecond)
			}
			// The commands with TLS files at this plaintext node are
			// told to leave them out.
			if m := regexp.MustCompile(`coordinator started.* admin_addr=(\S+)`).FindStringSubmatch(stderr.String()); m == nil {
				t.Errorf("start-up log names no admin address:\n%s", stderr.String())
			} else {
				err := run(ctx, []string{"status", "-addr", m[1], "-timeout", "2s", "-tls-cert", f.Cert, "-tls-key", f.Key, "-tls-ca", f.CA}, &bytes.Buffer{}, &bytes.Buffer{}, noEnv)
				if err == nil || !strings.Contains(err.Error(), "hint: the node answers in plaintext") {
					t.Errorf("status with TLS files at a plaintext node: %v, want a hint to leave them out", err)
				}
			}
			cancel()
			<-done
			if !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("start-up log lacks %q:\n%s", tc.want, stderr.String())
			}
		})
	}
	for _, tc := range []struct {
		extra []string
		want  string
	}{
		{[]string{"-tls-cert", f.Cert, "-tls-key", f.Key, "-tls-ca", f.CA, "-insecure"}, "choose plaintext or TLS"},
		{[]string{"-tls-cert", f.Cert}, "missing [-tls-key -tls-ca]"},
	} {
		err := run(context.Background(), append(append([]string{}, base...), append([]string{"-data-dir", t.TempDir()}, tc.extra...)...), &bytes.Buffer{}, &bytes.Buffer{}, noEnv)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error containing %q", tc.extra, err, tc.want)
		}
	}
}

// The commands talk only to a server whose certificate names a
// coordinator: one holding another certificate of the CA (an agent's, an
// operator's) fails the check at the handshake, and the admin token, sent
// with each call, never reaches it.
func TestCommandsTalkOnlyToACoordinator(t *testing.T) {
	pki := harness.NewPKI(t)
	file, token := harness.AdminToken(t)
	ops := pki.Operator("ops")
	for _, tc := range []struct {
		name string
		f    tlsfiles.Files
	}{
		{"an agent's", pki.Agent("a1")},
		{"an operator's", pki.Operator("mallory")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rogue := harness.StartRogue(t, pki, tc.f)
			for _, cmd := range [][]string{
				{"status"},
				{"tune", "-rule", "hot", "-max-slice", "1"},
			} {
				args := append(append([]string{}, cmd...), "-addr", rogue.Addr, "-timeout", "2s", "-token-file", file,
					"-tls-cert", ops.Cert, "-tls-key", ops.Key, "-tls-ca", ops.CA)
				err := run(context.Background(), args, &bytes.Buffer{}, &bytes.Buffer{}, noEnv)
				if err == nil || !strings.Contains(err.Error(), "coordinator") {
					t.Errorf("%s against a server with %s certificate: %v, want the certificate refused as no coordinator's", cmd[0], tc.name, err)
				}
			}
			if rogue.Conns() == 0 {
				t.Fatal("the rogue was never dialed")
			}
			for _, tok := range rogue.Tokens() {
				if strings.Contains(tok, token) {
					t.Fatalf("the rogue received the admin token (calls %q)", rogue.Calls())
				}
			}
			if calls := rogue.Calls(); len(calls) != 0 {
				t.Fatalf("the rogue received calls %q", calls)
			}
		})
	}
}
