package deploy

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestExampleRules: examples/rules.yaml, which the README's commands use,
// passes both binaries' -validate.
func TestExampleRules(t *testing.T) {
	file := filepath.Join(repoRoot, "examples", "rules.yaml")
	for _, args := range [][]string{
		{"gateway-agent", "-validate", "-rules", file},
		{"coordinator", "-validate", "-rules", file, "-data-dir", t.TempDir(), "-insecure"},
	} {
		if out, err := exec.Command(binary(t, args[0]), args[1:]...).CombinedOutput(); err != nil {
			t.Errorf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestDevSamplesAgree runs the README's two -dev commands as two
// processes: gateway-agent -dev pointed at coordinator -dev decides the
// README's leased rule (hot-endpoint, endpoint=checkout) from a lease the
// coordinator grants, because both run with examples/rules.yaml.
func TestDevSamplesAgree(t *testing.T) {
	coord := start(t, "coordinator", nil, "-dev", "-raft", "127.0.0.1:0", "-grpc", "127.0.0.1:0", "-http", "127.0.0.1:0", "-admin", "127.0.0.1:0")
	m := coord.wait(t, coordStarted, 30*time.Second)
	grpcAddr, adminAddr := m[1], m[3]
	agent := start(t, "gateway-agent", nil, "-dev", "-coordinators", grpcAddr, "-http", "127.0.0.1:0", "-grpc", "127.0.0.1:0")
	httpAddr := agent.wait(t, agentStarted, 30*time.Second)[2]
	var last string
	eventually(t, 20*time.Second, "hot-endpoint decided from a lease", func() bool {
		_, last = httpPost(t, "http://"+httpAddr+"/v1/allow", `{"descriptors":{"endpoint":"checkout"}}`)
		return strings.Contains(last, `"rule":"hot-endpoint"`) && strings.Contains(last, `"reason":"ok"`)
	})
	out, err := exec.Command(binary(t, "coordinator"), "quotas", "-addr", adminAddr).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "hot-endpoint|") {
		t.Errorf("coordinator quotas: %v, want the hot-endpoint quota:\n%s", err, out)
	}
	if strings.Contains(agent.output(), "level=ERROR") {
		t.Errorf("the agent logged errors:\n%s", agent.output())
	}
}
