package main

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/harness"
)

// guideTools are the first words of the guide's command lines; the
// guide's other indented lines list the topology.
var guideTools = map[string]bool{"ration-bench": true, "coordinator": true, "ration-check": true, "curl": true, "export": true, "watch": true, "kill": true}

// TestDemoRegionsGuide starts deploy/local/demo-regions.sh as make
// demo-regions does (no arguments: it prints a guide and runs until
// stopped) and runs every command of its guide as written, in order, as
// a reader pastes them into a second shell: the two ration-bench loads in
// the background to their end (60s), the curl, the export of the operator
// certificate, the CLI's leases, quotas, tune and tunings, the cut of the
// global group (kill -STOP of its three pids, then kill -CONT), and ration-check over every admission. Two commands
// are adapted, each for a reason: watch -n1 CMD runs CMD once (watch
// needs a terminal and never ends), and kill -STOP's <pids> placeholder
// is filled with the global nodes' pids (found by their -data-dir, where
// the guide's ps -ef | grep global would also list other processes). Each must exit 0; the curl
// answers 200 or 429 (never 503), before and during the cut; the eu
// region holds the one quota the guide says all three commands share,
// api=x0 of global-api, and no other; the tunings show both; and
// ration-check finds every admission within B + r*T.
func TestDemoRegionsGuide(t *testing.T) {
	script := demoScript(t, "builds and runs 11 processes for over a minute; skipped under -short")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	demo := exec.CommandContext(ctx, "bash", script)
	demo.Cancel = func() error { return demo.Process.Signal(syscall.SIGTERM) }
	demo.WaitDelay = 10 * time.Second
	demo.Env = demoEnv(dir)
	stdout, err := demo.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr harness.LogBuffer // written by the process's copier while the test reads it
	demo.Stderr = &stderr
	if err := demo.Start(); err != nil {
		t.Fatal(err)
	}
	// Ctrl-C, as the guide says, once the test is done (the script's trap
	// stops what it started); first continue anything the test stopped.
	var stopped []int
	t.Cleanup(func() {
		if t.Failed() {
			for _, f := range []string{"coordinator-eu", "eu-a1", "global0"} {
				if b, err := os.ReadFile(filepath.Join(dir, "logs", f+".log")); err == nil {
					t.Logf("%s.log:\n%s", f, b)
				}
			}
		}
		for _, p := range stopped {
			syscall.Kill(p, syscall.SIGCONT)
		}
		demo.Process.Signal(syscall.SIGINT)
		demo.Wait()
	})

	var guide []string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		guide = append(guide, sc.Text())
		if strings.Contains(sc.Text(), "Ctrl-C stops everything.") {
			break
		}
	}
	go func() { // keep the pipe drained
		for sc.Scan() {
		}
	}()
	if !strings.Contains(strings.Join(guide, "\n"), "Ctrl-C stops everything.") {
		for _, f := range []string{"global0", "coordinator-eu", "eu-a1"} {
			if b, err := os.ReadFile(filepath.Join(dir, "logs", f+".log")); err == nil {
				t.Logf("%s.log:\n%s", f, b)
			}
		}
		t.Fatalf("demo-regions.sh printed no guide:\n%s\n%s", strings.Join(guide, "\n"), stderr.String())
	}
	cmds := guideCommands(guide)
	if len(cmds) < 12 {
		t.Fatalf("found %d commands in the guide, want at least 12 (the parser lost some):\n%s", len(cmds), strings.Join(guide, "\n"))
	}

	env := os.Environ()
	sh := func(what, cmd string) string {
		t.Helper()
		c := exec.CommandContext(ctx, "bash", "-c", cmd)
		c.Env = env
		c.WaitDelay = 5 * time.Second
		out, err := c.CombinedOutput()
		t.Logf("$ %s\n%s", cmd, out)
		if err != nil {
			t.Fatalf("%s: %v\n%s", what, err, out)
		}
		return string(out)
	}
	var bench []*exec.Cmd
	outs := map[string]string{}
	for _, cmd := range cmds {
		word := filepath.Base(strings.Fields(cmd)[0])
		switch {
		case word == "export":
			// The reader's second shell keeps these for the commands after.
			for _, kv := range strings.Fields(cmd)[1:] {
				env = append(env, kv)
			}
		case word == "watch":
			f := strings.Fields(cmd)
			if len(f) < 3 || f[1] != "-n1" {
				t.Fatalf("guide: %q: want watch -n1 CMD", cmd)
			}
			outs[cmd] = sh(cmd, strings.Join(f[2:], " "))
		case word == "kill":
			if !strings.HasPrefix(cmd, "kill -STOP <pids of global0..2>") {
				t.Fatalf("guide: %q: the test knows kill -STOP <pids of global0..2> only", cmd)
			}
			pids := globalPIDs(t, dir)
			var ps []string
			for _, p := range pids {
				ps = append(ps, strconv.Itoa(p))
			}
			stopped = pids
			logs := agentLogs(t, dir)
			sh("cut the global group", "kill -STOP "+strings.Join(ps, " "))
			// The regions go on deciding from their slices, then their
			// safe shares, with no moment between the two without a
			// lease: every answer is the rule's (200 or 429), never the
			// fail_closed rule's failure policy (503). The curl samples
			// one agent; the loads drive all four, whose logs name every
			// activation of a failure policy.
			var codes []string
			for range 20 {
				codes = append(codes, strings.TrimSpace(sh("curl during the cut", curlCmd(t, cmds))))
				time.Sleep(300 * time.Millisecond)
			}
			t.Logf("answers during the cut, 300ms apart: %v (503: %d)", codes, strings.Count(strings.Join(codes, " "), "503"))
			for i, code := range codes {
				if code != "200" && code != "429" {
					t.Errorf("answer %d of the cut: %s, want 200 or 429: %v", i, code, codes)
				}
			}
			for _, l := range logs.since(t) {
				if strings.Contains(l[1], "failure policy activated") && strings.Contains(l[1], "global-api") {
					t.Errorf("agent %s during the cut: %s", l[0], l[1])
				}
			}
			sh("heal", "kill -CONT "+strings.Join(ps, " "))
			stopped = nil
		case strings.HasSuffix(cmd, "&"):
			c := exec.CommandContext(ctx, "bash", "-c", strings.TrimSuffix(cmd, "&"))
			c.Env = env
			c.WaitDelay = 5 * time.Second
			var out bytes.Buffer
			c.Stdout, c.Stderr = &out, &out
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
			bench = append(bench, c)
			t.Cleanup(func() {
				if c.ProcessState == nil {
					c.Process.Kill()
					c.Wait()
				}
			})
			continue
		case word == "ration-check":
			// After the loads' 60s, as a reader checks what they did.
			for _, c := range bench {
				if err := c.Wait(); err != nil {
					t.Fatalf("%s: %v\n%s", c.Args[2], err, c.Stdout)
				}
			}
			time.Sleep(500 * time.Millisecond) // the agents write admissions in batches
			outs[cmd] = sh(cmd, cmd)
		default:
			outs[cmd] = sh(cmd, cmd)
		}
	}

	find := func(pat string) string {
		re := regexp.MustCompile(pat)
		for _, c := range cmds {
			if re.MatchString(c) {
				return outs[c]
			}
		}
		t.Fatalf("no command of the guide matches %s", pat)
		return ""
	}
	if code := strings.TrimSpace(find(`^curl `)); code != "200" && code != "429" {
		t.Errorf("the guide's curl answered %s, want 200 or 429", code)
	}
	quotas := find(`coordinator quotas `)
	if !regexp.MustCompile(`(?m)^global-api\|api=x0\s`).MatchString(quotas) || regexp.MustCompile(`(?m)^global-api\|x0\s`).MatchString(quotas) {
		t.Errorf("eu's quotas: want global-api's subject api=x0, which all three commands share, and no quota x0:\n%s", quotas)
	}
	tunings := find(`coordinator tunings `)
	// RULE REGION LEASE-PERIOD RENEW-AT MIN-SLICE MAX-SLICE WEIGHT SAFE-SHARE
	for _, want := range []string{`(?m)^global-api\s+eu\s+-\s+-\s+-\s+-\s+3\s+-\s*$`, `(?m)^global-api\s+us\s+-\s+-\s+-\s+5\s+-\s+-\s*$`} {
		if !regexp.MustCompile(want).MatchString(tunings) {
			t.Errorf("tunings lack %s:\n%s", want, tunings)
		}
	}
	check := find(`ration-check `)
	if !strings.Contains(check, "global-api|api=x0") || !strings.Contains(check, " ok ") || strings.Contains(check, "VIOLATION") {
		t.Errorf("ration-check: want global-api|api=x0 ok:\n%s", check)
	}
}

// guideCommands returns the guide's command lines, its text with the
// script's values substituted, in order.
func guideCommands(guide []string) []string {
	var out []string
	for _, l := range guide {
		if !strings.HasPrefix(l, "  ") {
			continue
		}
		l = strings.TrimSpace(l)
		f := strings.Fields(l)
		if len(f) > 0 && guideTools[filepath.Base(f[0])] {
			out = append(out, l)
		}
	}
	return out
}

// curlCmd is the guide's curl command.
func curlCmd(t *testing.T, cmds []string) string {
	t.Helper()
	for _, c := range cmds {
		if strings.HasPrefix(c, "curl ") {
			return c
		}
	}
	t.Fatal("the guide has no curl")
	return ""
}

// globalPIDs finds the global group's three coordinators of this demo
// (their -data-dir is under dir), as a reader finds them with ps.
func globalPIDs(t *testing.T, dir string) []int {
	t.Helper()
	var pids []int
	files, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "-data-dir" && strings.HasPrefix(args[i+1], filepath.Join(dir, "global")) {
				p, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
				pids = append(pids, p)
			}
		}
	}
	if len(pids) != 3 {
		t.Fatalf("found %d global coordinators of the demo, want 3: %v", len(pids), pids)
	}
	return pids
}

// logMarks are the agents' log files and their sizes at one moment.
type logMarks struct {
	dir  string
	size map[string]int
}

// agentLogs marks where each agent's log ends now.
func agentLogs(t *testing.T, dir string) logMarks {
	t.Helper()
	m := logMarks{dir: dir, size: map[string]int{}}
	for _, id := range []string{"eu-a1", "eu-a2", "us-a1", "us-a2"} {
		b, err := os.ReadFile(filepath.Join(dir, "logs", id+".log"))
		if err != nil {
			t.Fatalf("agent log: %v", err)
		}
		m.size[id] = len(b)
	}
	return m
}

// since returns each line an agent logged after the marks, with the
// agent's id.
func (m logMarks) since(t *testing.T) [][2]string {
	t.Helper()
	var out [][2]string
	for _, id := range []string{"eu-a1", "eu-a2", "us-a1", "us-a2"} {
		b, err := os.ReadFile(filepath.Join(m.dir, "logs", id+".log"))
		if err != nil {
			t.Fatalf("agent log: %v", err)
		}
		for _, line := range strings.Split(string(b[min(m.size[id], len(b)):]), "\n") {
			if line != "" {
				out = append(out, [2]string{id, line})
			}
		}
	}
	return out
}
