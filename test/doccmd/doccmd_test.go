// Package doccmd runs the shell commands of README.md, deploy/README.md
// and docs/ as they are written. It holds no code: TestDocCommands is the
// whole of it.
package doccmd

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// A fence of shell commands (```sh, ```bash, ```shell, ```console) in
// README.md, deploy/README.md or docs/ must say, on the line before it,
// what this test does with it:
//
//	<!-- doccmd: run[; OPTION]... -->    run as written (below)
//	<!-- doccmd: skip: REASON -->         not run, for the reason given
//
// so that no command is left unchecked silently: a fence without a marker
// fails the test. The fences marked run are run in document order, one
// document per session, in namespaces of their own (unshare: a user, a
// network with its own loopback, a PID namespace, and a mount namespace
// where /tmp is empty and the work tree is an overlay whose writes vanish
// with the session). So the commands bind their documented ports
// (8080, 8301, 6379...) without meeting the machine's processes or each
// other's, write where they say (certs/, /tmp/ration), and nothing outlives
// the session. The binaries the docs call by name (coordinator,
// gateway-agent, ration-bench) are built from the tree onto
// PATH first, as make install would put them there.
//
// A command that starts a server (gateway-agent or coordinator with flags
// and no -validate/-version, redis-server; as go run ./cmd/... or by name)
// runs in the background, as a reader runs it in a terminal of its own,
// and the session waits for the next of the fence's ready probes before
// going on. Servers stay up for the later fences of the document, until a
// fence with stop or the session's end. Options:
//
//	ready URL...   one probe per server the fence starts, in order:
//	               http://... answers 2xx, or tcp://host:port accepts
//	stop           stop the servers of the earlier fences first (a reader's Ctrl-C)
//	redis          a redis-server on 127.0.0.1:6379 for the session (the
//	               namespace's loopback: never the machine's Redis)
//	copy SRC DST   copy SRC of the tree to DST first (the operator's file
//	               a command names, e.g. rules.yaml)
//	expect REGEXP  the fence's output must match (Go syntax, (?s) implied)
//
// Every other command must exit 0.

// only limits a run to the documents it matches, for work on one of them:
// go test -run TestDocCommands ./test/doccmd -only README.md
var only = flag.String("only", "", "check only the documents (paths from the repository root) this regexp matches")

// docs are the documents whose commands are checked.
func docs(t *testing.T, root string) []string {
	t.Helper()
	files := []string{filepath.Join(root, "README.md"), filepath.Join(root, "deploy", "README.md")}
	for _, g := range []string{"docs/*.md", "docs/integrations/*.md"} {
		m, err := filepath.Glob(filepath.Join(root, g))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	return files
}

type fence struct {
	where  string // README.md:28 (the line of the opening ```)
	script string // the commands, indentation removed
	skip   string // the reason, when skipped
	opts   options
}

type options struct {
	ready  []string
	stop   bool
	redis  bool
	copies [][2]string
	expect *regexp.Regexp
}

var (
	openRe   = regexp.MustCompile("^(\\s*)```(\\w*)\\s*$")
	markerRe = regexp.MustCompile(`^\s*<!-- doccmd: (.*?) -->\s*$`)
	shell    = map[string]bool{"sh": true, "bash": true, "shell": true, "console": true}
)

// parse returns the shell fences of a document, and a problem with each
// fence whose marker is missing or malformed.
func parse(rel string, b []byte) (fences []fence, problems []string) {
	lines := strings.Split(string(b), "\n")
	for i := 0; i < len(lines); i++ {
		m := openRe.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		indent, lang, start := m[1], m[2], i
		var body []string
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
			body = append(body, strings.TrimPrefix(lines[i], indent))
		}
		if !shell[lang] {
			continue
		}
		f := fence{where: fmt.Sprintf("%s:%d", rel, start+1), script: strings.Join(body, "\n") + "\n"}
		prev := ""
		for j := start - 1; j >= 0; j-- {
			if strings.TrimSpace(lines[j]) != "" {
				prev = lines[j]
				break
			}
		}
		mm := markerRe.FindStringSubmatch(prev)
		if mm == nil {
			problems = append(problems, f.where+": a shell fence without a <!-- doccmd: run --> or <!-- doccmd: skip: REASON --> marker on the line before it")
			continue
		}
		if err := f.parseMarker(mm[1]); err != nil {
			problems = append(problems, fmt.Sprintf("%s: doccmd marker %q: %v", f.where, mm[1], err))
			continue
		}
		fences = append(fences, f)
	}
	return fences, problems
}

func (f *fence) parseMarker(m string) error {
	if reason, ok := strings.CutPrefix(m, "skip:"); ok {
		if f.skip = strings.TrimSpace(reason); f.skip == "" {
			return fmt.Errorf("skip needs a reason")
		}
		return nil
	}
	parts := strings.Split(m, ";")
	if strings.TrimSpace(parts[0]) != "run" {
		return fmt.Errorf("want run or skip: REASON")
	}
	for _, p := range parts[1:] {
		word, arg, _ := strings.Cut(strings.TrimSpace(p), " ")
		switch word {
		case "stop":
			f.opts.stop = true
		case "redis":
			f.opts.redis = true
		case "ready":
			f.opts.ready = strings.Fields(arg)
		case "copy":
			a := strings.Fields(arg)
			if len(a) != 2 {
				return fmt.Errorf("copy SRC DST")
			}
			f.opts.copies = append(f.opts.copies, [2]string{a[0], a[1]})
		case "expect":
			re, err := regexp.Compile("(?s)" + arg)
			if err != nil {
				return err
			}
			f.opts.expect = re
		default:
			return fmt.Errorf("unknown option %q", word)
		}
	}
	if n := len(serverCommands(f.script)); n != len(f.opts.ready) {
		return fmt.Errorf("the fence starts %d servers and names %d ready probes", n, len(f.opts.ready))
	}
	return nil
}

// commands splits a fence into commands: lines joined at a trailing
// backslash, blank and comment-only lines dropped.
func commands(script string) []string {
	var out []string
	cur := ""
	for _, l := range strings.Split(script, "\n") {
		if strings.HasSuffix(l, "\\") {
			cur += strings.TrimSuffix(l, "\\") + " "
			continue
		}
		cur += l
		if s := strings.TrimSpace(cur); s != "" && !strings.HasPrefix(s, "#") {
			out = append(out, cur)
		}
		cur = ""
	}
	return out
}

var serverRe = regexp.MustCompile(`^\s*(go run \./cmd/|(\S*/)?)(gateway-agent|coordinator) -|^\s*redis-server\b`)

func isServer(cmd string) bool {
	if !serverRe.MatchString(cmd) {
		return false
	}
	for _, w := range strings.Fields(stripComment(cmd)) {
		if w == "-validate" || w == "-version" || w == "-h" {
			return false
		}
	}
	return true
}

func serverCommands(script string) (out []string) {
	for _, c := range commands(script) {
		if isServer(c) {
			out = append(out, c)
		}
	}
	return out
}

// stripComment drops a trailing "  # ..." and a trailing "&" of a server
// command, which the session starts in the background itself.
func stripComment(cmd string) string {
	if i := strings.Index(cmd, " #"); i >= 0 && !strings.ContainsAny(cmd[i:], `'"`) {
		cmd = cmd[:i]
	}
	return strings.TrimSuffix(strings.TrimSpace(cmd), "&")
}

// prelude starts every session's script (its root and binaries' %q):
// the namespaces' mounts, and the functions each fence's commands are run
// by. doc_serve starts a server in a process group of its own, so that
// doc_stop ends go run and the binary it started alike.
const prelude = `set -uo pipefail
set -a # a fence's variables reach the servers it starts, as in one terminal
root=%q
ip link set lo up
# The work tree and the binaries are bound under /mnt before /tmp is
# emptied: either may be under /tmp (a clone in /tmp, go test's TempDir).
mount -t tmpfs tmpfs /mnt
mkdir -p /mnt/bin /mnt/root
mount --bind %q /mnt/bin
mount --bind "$root" /mnt/root
mount -t tmpfs tmpfs /tmp
export TMPDIR=/tmp
mkdir -p /tmp/.doccmd/upper /tmp/.doccmd/work /tmp/.doccmd/logs "$root"
mount -t overlay overlay -o "lowerdir=/mnt/root,upperdir=/tmp/.doccmd/upper,workdir=/tmp/.doccmd/work" "$root"
cd "$root"
export PATH=/mnt/bin:$PATH
servers=() redis=()
doc_stop() {
  local p
  for p in "${servers[@]}"; do kill -TERM -- "-$p" 2>/dev/null; done
  for p in "${servers[@]}"; do wait "$p" 2>/dev/null; done
  servers=()
}
trap 'doc_stop; for p in "${redis[@]}"; do kill -- "-$p" 2>/dev/null; done' EXIT
doc_fail() {
  echo "::doccmd-fail $1"
  for f in /tmp/.doccmd/logs/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 30 "$f"; }; done
  exit 1
}
doc_ready() { # URL PID
  local i hp
  for i in $(seq 900); do
    case $1 in
      tcp://*) hp=${1#tcp://}; (exec 3<>"/dev/tcp/${hp%%:*}/${hp##*:}") 2>/dev/null && return 0 ;;
      *) curl -sf -o /dev/null "$1" && return 0 ;;
    esac
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
doc_serve() { # WHERE N URL, the command on stdin
  local cmd log=/tmp/.doccmd/logs/$2.log
  cmd=$(cat)
  echo "+ $cmd &"
  # A fence's shell functions too (docs/security.md's tls).
  local fn
  for fn in $(compgen -A function); do export -f "$fn"; done
  setsid bash -c "$cmd" >"$log" 2>&1 &
  local pid=$!
  [ "$1" = redis ] && redis+=("$pid") || servers+=("$pid")
  doc_ready "$3" "$pid" || doc_fail "$1: not ready at $3 (log $log)"
}
doc_run() { # WHERE, the command on stdin
  local cmd
  cmd=$(cat)
  echo "+ $cmd"
  eval "$cmd" || doc_fail "$1: exit status $?"
}
`

// sessionScript is the bash program of one document's run fences.
// The binaries, built once for every session in bin, are bound to
// /mnt/bin before /tmp, where bin is, is emptied.
func sessionScript(root, bin string, fences []fence) string {
	var b strings.Builder
	fmt.Fprintf(&b, prelude, root, bin)
	redisUp, n := false, 0
	for _, f := range fences {
		if f.skip != "" {
			continue
		}
		fmt.Fprintf(&b, "echo '::doccmd-begin %s'\n", f.where)
		if f.opts.stop {
			b.WriteString("doc_stop\n")
		}
		if f.opts.redis && !redisUp {
			redisUp = true
			b.WriteString("doc_serve redis redis tcp://127.0.0.1:6379 <<'DOCCMD_EOF'\nredis-server --port 6379 --bind 127.0.0.1 --save '' --appendonly no\nDOCCMD_EOF\n")
		}
		for _, c := range f.opts.copies {
			fmt.Fprintf(&b, "mkdir -p \"$(dirname %q)\" && cp %q %q || doc_fail %q\n", c[1], c[0], c[1], f.where+": copy")
		}
		ready := f.opts.ready
		cmds := commands(f.script)
		if len(ready) == 0 {
			// No server: the fence is one script (a loop may span lines).
			cmds = []string{f.script}
		}
		for _, c := range cmds {
			if isServer(c) {
				n++
				fmt.Fprintf(&b, "doc_serve %q server%d %q <<'DOCCMD_EOF'\n%s\nDOCCMD_EOF\n", f.where, n, ready[0], stripComment(c))
				ready = ready[1:]
				continue
			}
			fmt.Fprintf(&b, "doc_run %q <<'DOCCMD_EOF'\n%s\nDOCCMD_EOF\n", f.where, c)
		}
		fmt.Fprintf(&b, "echo '::doccmd-end %s'\n", f.where)
	}
	return b.String()
}

func TestDocCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("-short (make check): the docs' commands run real processes; make test runs them")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	byDoc := map[string][]fence{}
	var order []string
	for _, p := range docs(t, root) {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, p)
		if *only != "" && !regexp.MustCompile(*only).MatchString(rel) {
			continue
		}
		fences, problems := parse(rel, b)
		for _, pr := range problems {
			t.Error(pr)
		}
		if len(fences) > 0 {
			byDoc[rel] = fences
			order = append(order, rel)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	runs := 0
	for _, d := range order {
		for _, f := range byDoc[d] {
			if f.skip == "" {
				runs++
			}
		}
	}
	if runs < 8 && *only == "" {
		t.Fatalf("only %d fences marked run: the test would check next to nothing", runs)
	}
	if err := exec.Command("unshare", "-r", "-n", "-m", "--pid", "--fork", "--kill-child", "true").Run(); err != nil {
		t.Skipf("the commands run in namespaces of their own (their documented ports, /tmp, no Redis of the machine's) and unshare cannot make them here: %v; the markers were checked", err)
	}
	for _, bin := range []string{"ip", "curl", "redis-server", "make", "jq", "setsid"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("the documented commands need %s: %v", bin, err)
		}
	}
	// The binaries the docs call by name, as make install would put them
	// on PATH.
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+string(filepath.Separator), "./cmd/coordinator", "./cmd/gateway-agent", "./cmd/ration-bench")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	// Sessions share nothing but the binaries (each has its own network,
	// /tmp and overlay): they run side by side.
	for _, d := range order {
		t.Run(strings.ReplaceAll(d, "/", "_"), func(t *testing.T) {
			t.Parallel()
			runSession(t, root, bin, byDoc[d])
		})
	}
}

// runSession runs one document's fences in one session and reports each
// fence as a subtest: skipped with its reason, or passed or failed with
// its output.
func runSession(t *testing.T, root, bin string, fences []fence) {
	hasRun := false
	for _, f := range fences {
		hasRun = hasRun || f.skip == ""
	}
	out := map[string]string{}
	failed, failure := "", ""
	if hasRun {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "unshare", "-r", "-n", "-m", "--pid", "--fork", "--kill-child", "bash", "-c", sessionScript(root, bin, fences))
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
		var buf bytes.Buffer
		cmd.Stdout, cmd.Stderr = &buf, &buf
		err := cmd.Run()
		cur := ""
		var all strings.Builder
		sc := bufio.NewScanner(&buf)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			l := sc.Text()
			all.WriteString(l + "\n")
			switch {
			case strings.HasPrefix(l, "::doccmd-begin "):
				cur = strings.TrimPrefix(l, "::doccmd-begin ")
			case strings.HasPrefix(l, "::doccmd-end "):
				cur = ""
			case strings.HasPrefix(l, "::doccmd-fail "):
				failed = strings.TrimPrefix(l, "::doccmd-fail ")
			default:
				if cur != "" {
					out[cur] += l + "\n"
				}
			}
		}
		if err != nil {
			failure = fmt.Sprintf("session: %v\n%s", err, all.String())
		}
	}
	for _, f := range fences {
		t.Run(filepath.Base(f.where), func(t *testing.T) {
			if f.skip != "" {
				t.Skip(f.skip)
			}
			if failed != "" && strings.HasPrefix(failed, f.where+":") || failed == f.where {
				t.Fatalf("%s failed:\n%s\n%s", f.where, f.script, failure)
			}
			got, ok := out[f.where]
			if !ok {
				t.Fatalf("%s did not run (an earlier fence failed?):\n%s", f.where, failure)
			}
			if f.opts.expect != nil && !f.opts.expect.MatchString(got) {
				t.Errorf("%s: output does not match %q:\n%s", f.where, f.opts.expect, got)
			}
		})
	}
	if failure != "" && failed == "" {
		t.Errorf("%s", failure)
	}
}
