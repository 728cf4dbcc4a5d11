package deploy

import (
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// dockerfile is deploy/docker/Dockerfile, parsed enough to run its build
// stage here and to check its run-time stages.
type dockerfile struct {
	args   map[string]string // ARG defaults
	stages []*stage
}

type stage struct {
	from, name string
	lines      []instruction
}

type instruction struct {
	cmd, rest string
	line      int
}

// parseDockerfile reads the instructions, joining continued lines and
// dropping comments.
func parseDockerfile(b []byte) (*dockerfile, error) {
	d := &dockerfile{args: map[string]string{}}
	var cur *stage
	sc := bufio.NewScanner(bytes.NewReader(b))
	var buf strings.Builder
	start, n := 0, 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if buf.Len() == 0 && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if buf.Len() == 0 {
			start = n
		}
		if s, ok := strings.CutSuffix(line, "\\"); ok {
			buf.WriteString(s + " ")
			continue
		}
		buf.WriteString(line)
		full := buf.String()
		buf.Reset()
		cmd, rest, _ := strings.Cut(full, " ")
		in := instruction{cmd: strings.ToUpper(cmd), rest: strings.TrimSpace(rest), line: start}
		switch in.cmd {
		case "FROM":
			f := strings.Fields(in.rest)
			st := &stage{from: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.name = f[2]
			} else if len(f) != 1 {
				return nil, fmt.Errorf("line %d: FROM %q: want IMAGE [AS NAME]", start, in.rest)
			}
			d.stages = append(d.stages, st)
			cur = st
			continue
		case "ARG":
			if cur == nil {
				k, v, _ := strings.Cut(in.rest, "=")
				d.args[k] = v
				continue
			}
		}
		if cur == nil {
			return nil, fmt.Errorf("line %d: %s before FROM", start, in.cmd)
		}
		cur.lines = append(cur.lines, in)
	}
	if buf.Len() > 0 {
		return nil, fmt.Errorf("line %d: continuation at end of file", start)
	}
	return d, sc.Err()
}

func (d *dockerfile) stage(name string) *stage {
	for _, s := range d.stages {
		if s.name == name {
			return s
		}
	}
	return nil
}

func (s *stage) all(cmd string) []instruction {
	var out []instruction
	for _, in := range s.lines {
		if in.cmd == cmd {
			out = append(out, in)
		}
	}
	return out
}

// expand replaces ${NAME} and $NAME with the ARG defaults.
func (d *dockerfile) expand(s string) string {
	return os.Expand(s, func(k string) string { return d.args[k] })
}

var mountFlag = regexp.MustCompile(`^--mount=\S+\s*`)

// buildCommands returns the build stage's RUN commands without their
// BuildKit --mount options, its ENV settings and its COPY sources (as
// "src dst" pairs from the context).
func (d *dockerfile) buildStage(t testing.TB) (runs []string, env []string, copies [][2]string, workdir string) {
	t.Helper()
	st := d.stage("build")
	if st == nil {
		t.Fatal("Dockerfile: no stage named build")
	}
	for _, in := range st.lines {
		switch in.cmd {
		case "RUN":
			r := in.rest
			for mountFlag.MatchString(r) {
				r = mountFlag.ReplaceAllString(r, "")
			}
			runs = append(runs, r)
		case "ENV":
			for _, kv := range strings.Fields(in.rest) {
				if !strings.Contains(kv, "=") {
					t.Fatalf("Dockerfile line %d: ENV %q: use ENV K=V", in.line, in.rest)
				}
				env = append(env, kv)
			}
		case "COPY":
			f := strings.Fields(in.rest)
			if strings.HasPrefix(f[0], "--") {
				t.Fatalf("Dockerfile line %d: COPY %s in the build stage: only context copies expected", in.line, in.rest)
			}
			dst := f[len(f)-1]
			for _, src := range f[:len(f)-1] {
				copies = append(copies, [2]string{src, dst})
			}
		case "WORKDIR":
			workdir = in.rest
		case "ARG":
			// A build argument is in the RUN commands' environment: the
			// test's value (as --build-arg would give it), else the default.
			k, v, _ := strings.Cut(in.rest, "=")
			if a, ok := dockerBuildArgs[k]; ok {
				v = a
			}
			env = append(env, k+"="+v)
		default:
			t.Fatalf("Dockerfile line %d: %s in the build stage: the test does not know how to run it", in.line, in.cmd)
		}
	}
	return runs, env, copies, workdir
}

// dockerBuildArgs are the --build-arg values the test builds with: the
// stamp -version and ration_build_info must report (TestVersion).
var dockerBuildArgs = map[string]string{"VERSION": "0.1.0-deploy-test", "COMMIT": "0123456789abcdef0123456789abcdef01234567"}

// dockerignore reports whether a context path is excluded: the last
// pattern matching the path or one of its parents decides.
type dockerignore []string

func (ig dockerignore) excluded(p string) bool {
	ex := false
	for _, pat := range ig {
		neg := strings.HasPrefix(pat, "!")
		pat = strings.TrimPrefix(pat, "!")
		if matchPathOrParent(pat, p) {
			ex = !neg
		}
	}
	return ex
}

func matchPathOrParent(pat, p string) bool {
	for q := p; q != "." && q != "/" && q != ""; q = path.Dir(q) {
		if globMatch(pat, q) {
			return true
		}
	}
	return false
}

// globMatch is path.Match plus "**/" matching any number of directories.
func globMatch(pat, p string) bool {
	if rest, ok := strings.CutPrefix(pat, "**/"); ok {
		for q := p; ; {
			if globMatch(rest, q) {
				return true
			}
			_, after, found := strings.Cut(q, "/")
			if !found {
				return false
			}
			q = after
		}
	}
	ok, _ := path.Match(pat, p)
	return ok
}

func readDockerignore(t testing.TB) dockerignore {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("docker", "Dockerfile.dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	var ig dockerignore
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			ig = append(ig, l)
		}
	}
	return ig
}

// contextCopy copies what the build stage's COPY lines take from the
// repository, minus what the dockerignore file excludes, into dir.
func contextCopy(t testing.TB, ig dockerignore, copies [][2]string, dir string) {
	t.Helper()
	for _, c := range copies {
		src, dst := path.Clean(c[0]), c[1]
		root := filepath.Join(repoRoot, src)
		info, err := os.Stat(root)
		if err != nil {
			t.Fatalf("Dockerfile COPY %s: %v", c[0], err)
		}
		if ig.excluded(src) && !info.IsDir() {
			t.Fatalf("Dockerfile COPY %s: excluded by Dockerfile.dockerignore", src)
		}
		copied := 0
		err = filepath.WalkDir(root, func(p string, de fs.DirEntry, err error) error {
			if err != nil || de.IsDir() {
				return err
			}
			rel, _ := filepath.Rel(repoRoot, p)
			rel = filepath.ToSlash(rel)
			if ig.excluded(rel) {
				return nil
			}
			// COPY dir/ dst/ copies the directory's contents into dst;
			// COPY file dst copies the file (dst/ keeps its name).
			var out string
			switch {
			case info.IsDir():
				inner, _ := filepath.Rel(root, p)
				out = filepath.Join(dst, inner)
			case strings.HasSuffix(dst, "/"):
				out = filepath.Join(dst, filepath.Base(p))
			default:
				out = dst
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out = filepath.Join(dir, out)
			if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
				return err
			}
			copied++
			return os.WriteFile(out, b, 0o644)
		})
		if err != nil {
			t.Fatal(err)
		}
		if copied == 0 {
			t.Fatalf("Dockerfile COPY %s: nothing left after Dockerfile.dockerignore", src)
		}
	}
}

// buildLikeDocker runs the Dockerfile's build stage on this machine: the
// COPY sources (filtered by the dockerignore file) into a temporary /src,
// the RUN commands there with /out mapped to outDir. It proves the
// commands and the copied sources suffice to build every binary.
func buildLikeDocker(t testing.TB, outDir string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("docker", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	d, err := parseDockerfile(b)
	if err != nil {
		t.Fatal(err)
	}
	runs, env, copies, workdir := d.buildStage(t)
	if workdir != "/src" {
		t.Fatalf("Dockerfile build stage WORKDIR %q, the test expects /src", workdir)
	}
	src := filepath.Join(filepath.Dir(outDir), "src")
	contextCopy(t, readDockerignore(t), copies, src)
	for _, r := range runs {
		r = strings.ReplaceAll(r, "/out/", outDir+"/")
		cmd := exec.Command("sh", "-ec", r)
		cmd.Dir = src
		cmd.Env = append(os.Environ(), env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("Dockerfile RUN %s: %v\n%s", r, err, out)
		}
	}
}

// TestDockerfile checks what the build cannot: the run-time stages.
func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("docker", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	d, err := parseDockerfile(b)
	if err != nil {
		t.Fatal(err)
	}

	// The build stage's Go is at least the one go.mod asks for.
	build := d.stage("build")
	if build == nil {
		t.Fatal("no build stage")
	}
	if !strings.HasPrefix(d.expand(build.from), "golang:") {
		t.Errorf("build stage FROM %s: want the official golang image", d.expand(build.from))
	}
	goMod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	want := regexp.MustCompile(`(?m)^go (\S+)`).FindSubmatch(goMod)
	have := strings.TrimPrefix(d.expand(build.from), "golang:")
	if want == nil || versionLess(have, string(want[1])) {
		t.Errorf("build stage Go %s is older than go.mod's go %s", have, want[1])
	}
	if !slices.ContainsFunc(build.all("ENV"), func(in instruction) bool { return strings.Contains(in.rest, "CGO_ENABLED=0") }) {
		t.Error("build stage: ENV CGO_ENABLED=0 missing: the run-time images have no libc")
	}

	// Run-time stages: distroless static (no shell), a numeric non-root
	// user (Kubernetes runAsNonRoot can only verify a number), exec-form
	// entrypoint, nothing run at build time in them.
	wantEntry := map[string][]string{
		"gateway-agent": {"/gateway-agent"},
		"coordinator":   {"/coordinator"},
	}
	wantFiles := map[string][]string{
		"gateway-agent": {"/gateway-agent"},
		"coordinator":   {"/coordinator", "/coordinator-launch"},
	}
	for name, entry := range wantEntry {
		st := d.stage(name)
		if st == nil {
			t.Errorf("no stage %q", name)
			continue
		}
		if !strings.HasPrefix(st.from, "gcr.io/distroless/static") || !strings.HasSuffix(st.from, ":nonroot") {
			t.Errorf("stage %s FROM %s: want gcr.io/distroless/static*:nonroot (no shell, no libc)", name, st.from)
		}
		if r := st.all("RUN"); len(r) > 0 {
			t.Errorf("stage %s line %d: RUN in a run-time stage: its base has no shell", name, r[0].line)
		}
		users := st.all("USER")
		if len(users) != 1 {
			t.Errorf("stage %s: want exactly one USER, have %d", name, len(users))
		} else {
			uid, _, _ := strings.Cut(users[0].rest, ":")
			if n, err := strconv.Atoi(uid); err != nil || n == 0 {
				t.Errorf("stage %s: USER %s: want a numeric non-root uid", name, users[0].rest)
			}
		}
		eps := st.all("ENTRYPOINT")
		var ep []string
		if len(eps) != 1 || json.Unmarshal([]byte(eps[0].rest), &ep) != nil {
			t.Errorf("stage %s: want one exec-form (JSON) ENTRYPOINT, have %v", name, eps)
		} else if !slices.Equal(ep, entry) {
			t.Errorf("stage %s: ENTRYPOINT %q, want %q", name, ep, entry)
		}
		var files []string
		for _, c := range st.all("COPY") {
			f := strings.Fields(c.rest)
			if !strings.HasPrefix(f[0], "--from=build") {
				t.Errorf("stage %s line %d: COPY %s: want --from=build only", name, c.line, c.rest)
			}
			files = append(files, f[len(f)-1])
		}
		slices.Sort(files)
		if !slices.Equal(files, wantFiles[name]) {
			t.Errorf("stage %s copies %q, want %q", name, files, wantFiles[name])
		}
	}
}

// TestBinariesStatic checks that what the Dockerfile's commands built runs
// without a libc or a loader, as distroless/static requires.
func TestBinariesStatic(t *testing.T) {
	for _, name := range []string{"gateway-agent", "coordinator", "coordinator-launch"} {
		f, err := elf.Open(binary(t, name))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s has a program interpreter: not static", name)
			}
		}
		if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
			t.Errorf("%s links %v (%v): not static", name, libs, err)
		}
		f.Close()
	}
}

// TestVersion: the binaries the Dockerfile built report the VERSION and
// COMMIT build arguments under -version, and exit 0.
func TestVersion(t *testing.T) {
	for _, name := range []string{"gateway-agent", "coordinator"} {
		out, err := exec.Command(binary(t, name), "-version").Output()
		if err != nil {
			t.Errorf("%s -version: %v", name, err)
			continue
		}
		want := regexp.MustCompile(`^` + name + ` version ` + regexp.QuoteMeta(dockerBuildArgs["VERSION"]) +
			`, commit ` + dockerBuildArgs["COMMIT"] + `, go1\.[0-9.]+\n$`)
		if !want.Match(out) {
			t.Errorf("%s -version printed %q, want %s", name, out, want)
		}
	}
}

// TestDockerignore: the dockerignore semantics this test implements.
func TestDockerignore(t *testing.T) {
	ig := dockerignore{"*", "!cmd", "!deploy/cmd/x/main.go", "**/*_test.go", "**/testdata"}
	for p, want := range map[string]bool{
		"cmd/a/main.go":             false,
		"cmd/a/main_test.go":        true,
		"internal/a.go":             true,
		"deploy/cmd/x/main.go":      false,
		"deploy/cmd/x/main_test.go": true,
		"cmd/a/testdata/f":          true,
		"go.mod":                    true,
	} {
		if got := ig.excluded(p); got != want {
			t.Errorf("excluded(%q) = %v, want %v", p, got, want)
		}
	}
}

func versionLess(a, b string) bool {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < max(len(pa), len(pb)); i++ {
		var x, y int
		if i < len(pa) {
			x, _ = strconv.Atoi(pa[i])
		}
		if i < len(pb) {
			y, _ = strconv.Atoi(pb[i])
		}
		if x != y {
			return x < y
		}
	}
	return false
}
