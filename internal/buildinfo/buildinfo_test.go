package buildinfo

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestResolve(t *testing.T) {
	stamped := &debug.BuildInfo{Settings: []debug.BuildSetting{
		{Key: "vcs", Value: "git"},
		{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
		{Key: "vcs.modified", Value: "false"},
	}}
	for _, c := range []struct {
		name            string
		version, commit string
		bi              *debug.BuildInfo
		want            Info
	}{
		{"ldflags win", "0.1.0", "feedface", stamped, Info{"0.1.0", "feedface", "go1.x"}},
		{"no ldflags, vcs stamp", "", "", stamped, Info{"dev", "0123456789abcdef0123456789abcdef01234567", "go1.x"}},
		{"no ldflags, no stamp", "", "", &debug.BuildInfo{}, Info{"dev", "unknown", "go1.x"}},
		{"no build info", "", "", nil, Info{"dev", "unknown", "go1.x"}},
		{"version only", "0.2.0", "", nil, Info{"0.2.0", "unknown", "go1.x"}},
	} {
		if got := resolve(c.version, c.commit, "go1.x", c.bi); got != c.want {
			t.Errorf("%s: resolve = %+v, want %+v", c.name, got, c.want)
		}
	}
}

// A test binary is built without -ldflags: version dev, this Go.
func TestGetAndPrint(t *testing.T) {
	i := Get()
	if i.Version != DevVersion || i.Go != runtime.Version() || i.Commit == "" {
		t.Fatalf("Get() = %+v, want version dev, a commit and %s", i, runtime.Version())
	}
	var b bytes.Buffer
	Print(&b, "tool")
	want := "tool version dev, commit " + i.Commit + ", " + runtime.Version() + "\n"
	if b.String() != want {
		t.Fatalf("Print = %q, want %q", b.String(), want)
	}
}

func TestCollector(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(collector(Info{"0.1.0", "abc", "go1.x"}))
	want := `# HELP ration_build_info Always 1; the labels say which build runs: version and commit (set at link time by make build or the Dockerfile; version "dev" otherwise) and the Go version.
# TYPE ration_build_info gauge
ration_build_info{commit="abc",go="go1.x",version="0.1.0"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), MetricName); err != nil {
		t.Fatal(err)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
}

// TestMakeStamps builds a binary with the -ldflags make build passes (read
// from make -n, so the Makefile and this package's variable names are held
// together) and runs its -version. make install must pass the same flags.
func TestMakeStamps(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary")
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	ldflags := regexp.MustCompile(`-ldflags '([^']*)'`)
	flagsOf := func(target string) string {
		out, err := exec.Command("make", "-s", "-n", "-C", "../..", target, "VERSION=1.2.3-test", "COMMIT=c0ffee").CombinedOutput()
		if err != nil {
			t.Fatalf("make -n %s: %v\n%s", target, err, out)
		}
		m := ldflags.FindSubmatch(out)
		if m == nil {
			t.Fatalf("make -n %s runs no go command with -ldflags:\n%s", target, out)
		}
		return string(m[1])
	}
	build := flagsOf("build")
	if install := flagsOf("install"); install != build {
		t.Errorf("make install -ldflags %q, make build %q: want the same", install, build)
	}
	bin := filepath.Join(t.TempDir(), "ration-check")
	if out, err := exec.Command("go", "build", "-ldflags", build, "-o", bin, "../../cmd/ration-check").CombinedOutput(); err != nil {
		t.Fatalf("go build -ldflags %q: %v\n%s", build, err, out)
	}
	out, err := exec.Command(bin, "-version").CombinedOutput()
	if err != nil {
		t.Fatalf("ration-check -version: %v\n%s", err, out)
	}
	if want := "ration-check version 1.2.3-test, commit c0ffee, " + runtime.Version() + "\n"; string(out) != want {
		t.Fatalf("ration-check -version printed %q, want %q", out, want)
	}
}
