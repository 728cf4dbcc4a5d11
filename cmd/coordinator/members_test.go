package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/internal/buildinfo"
	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/rules"
)

// members list, add and remove against a real 3-node group, each sent to
// a follower's admin listener: list reads the follower's configuration
// (with every member's lease and admin addresses), add and remove are
// followed to the leader's admin address. A fourth node, started without
// -join, becomes a voter through members add and leaves through members
// remove.
func TestMembersCommands(t *testing.T) {
	c := harness.StartCoordinators(t, 3, string(devRules))
	li, _ := c.Leader(t)
	follower := c.Node((li + 1) % 3).AdminAddr()
	members := func(args ...string) (string, error) {
		t.Helper()
		var out bytes.Buffer
		err := run(context.Background(), append([]string{"members"}, args...), &out, &bytes.Buffer{}, noEnv)
		return out.String(), err
	}
	row := func(id, suffrage string) *regexp.Regexp {
		return regexp.MustCompile(`(?m)^` + id + `\s+127\.0\.0\.1:\d+\s+` + suffrage + `\b`)
	}

	// A follower answers from its own state: let it apply the last
	// member's addresses (committed just before StartCoordinators
	// returned) first.
	c.Converged(t)
	out, err := members("list", "-addr", follower)
	if err != nil {
		t.Fatalf("members list: %v", err)
	}
	for i := range 3 {
		if !row(fmt.Sprintf("node%d", i), "Voter").MatchString(out) {
			t.Errorf("members list lacks node%d as a voter:\n%s", i, out)
		}
		n := c.Node(i)
		if !regexp.MustCompile(`(?m)^node` + fmt.Sprint(i) + `\s.*\sVoter\s+` + regexp.QuoteMeta(n.GRPCAddr()) + `\s+` + regexp.QuoteMeta(n.AdminAddr()) + `\b`).MatchString(out) {
			t.Errorf("members list lacks node%d's lease and admin addresses (%s, %s):\n%s", i, n.GRPCAddr(), n.AdminAddr(), out)
		}
	}
	if n := len(regexp.MustCompile(`(?m)\s+leader\s+(self|reachable|unknown)\s`).FindAllString(out, -1)); n != 1 {
		t.Errorf("members list marks %d leaders, want 1:\n%s", n, out)
	}
	// Health: the node asked is "self", the others reachable once its
	// probes (one a second) have been answered, each with its version.
	healthRow := func(id, health string) *regexp.Regexp {
		return regexp.MustCompile(`(?m)^` + id + `\s.*\s` + health + `\s+(\S+ ago|\(this node\))\s+\d+\s+\d+\s+` + regexp.QuoteMeta(buildinfo.Get().Version) + `\b.*\s\d[\d.]*[smhd]( \d+[smhd])?$`)
	}
	fi := (li + 1) % 3
	waitMembers(t, follower, func(out string) bool {
		for i := range 3 {
			h := "reachable"
			if i == fi {
				h = "self"
			}
			if !healthRow(fmt.Sprintf("node%d", i), h).MatchString(out) {
				return false
			}
		}
		return true
	})

	// A node that has not joined: not a member, which list says.
	set, err := rules.Parse("rules.yaml", devRules)
	if err != nil {
		t.Fatal(err)
	}
	cfg := harness.RaftTestConfig()
	cfg.ID, cfg.DataDir, cfg.Rules = "node3", t.TempDir(), set
	n3, err := coordinator.Start(context.Background(), cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n3.Close() })
	if _, err := members("list", "-addr", n3.AdminAddr()); err == nil || !strings.Contains(err.Error(), "not a member") {
		t.Errorf("members list at a node that never joined = %v, want it to say so", err)
	}

	out, err = members("add", "-addr", follower, "-id", "node3", "-raft-address", n3.RaftAddr(), "-grpc-address", n3.GRPCAddr(), "-admin-address", n3.AdminAddr())
	if err != nil {
		t.Fatalf("members add: %v", err)
	}
	if !strings.Contains(out, "added node3: a non-voter until the leader finds it caught up") || !row("node3", "(Nonvoter|Voter)").MatchString(out) {
		t.Errorf("members add printed:\n%s\nwant node3 added and listed", out)
	}
	c.WaitVoters(t, 4)
	// The new member learns the configuration from the leader.
	waitMembers(t, n3.AdminAddr(), func(out string) bool {
		return row("node3", "Voter").MatchString(out) && strings.Contains(out, "leader") && strings.Contains(out, n3.AdminAddr())
	})
	// Adding it again is a no-op, so a retried add is safe.
	if _, err := members("add", "-addr", follower, "-id", "node3", "-raft-address", n3.RaftAddr(), "-grpc-address", n3.GRPCAddr(), "-admin-address", n3.AdminAddr()); err != nil {
		t.Errorf("members add again: %v", err)
	}

	out, err = members("remove", "-addr", follower, "-id", "node3")
	if err != nil {
		t.Fatalf("members remove: %v", err)
	}
	if !strings.Contains(out, "removed node3") || strings.Contains(out, "node3 ") || !row("node0", "Voter").MatchString(out) {
		t.Errorf("members remove printed:\n%s\nwant node3 removed and the others listed", out)
	}
	c.WaitVoters(t, 3)
	waitMembers(t, follower, func(out string) bool { return !strings.Contains(out, "node3") })

	// allow registers an id that may join by itself; remove withdraws it.
	out, err = members("allow", "-addr", follower, "-id", "node4")
	if err != nil || !strings.Contains(out, "registered node4: it may now join") || !strings.Contains(out, "registered to join: node0, node1, node2, node4") {
		t.Errorf("members allow = %v, printed:\n%s\nwant node4 registered", err, out)
	}
	out, err = members("remove", "-addr", follower, "-id", "node4")
	if err != nil || !strings.Contains(out, "removed node4") || !strings.Contains(out, "registered to join: node0, node1, node2\n") {
		t.Errorf("members remove of a registered id = %v, printed:\n%s\nwant its registration withdrawn", err, out)
	}

	// Refusals name what is wrong.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"remove", "-addr", follower, "-id", "nosuch"}, `no server "nosuch"`},
		{[]string{"add", "-addr", follower, "-id", "node9", "-raft-address", "0.0.0.0:1", "-grpc-address", "127.0.0.1:1", "-admin-address", "127.0.0.1:2"}, "not dialable"},
		{[]string{"add", "-addr", follower, "-id", "node9", "-raft-address", "127.0.0.1:1", "-grpc-address", "127.0.0.1:1", "-admin-address", "0.0.0.0:2"}, "admin_address \"0.0.0.0:2\": not dialable"},
		{[]string{"add", "-addr", follower, "-id", "node9"}, "-raft-address, -grpc-address, -admin-address required"},
		{[]string{"remove", "-addr", follower}, "-id required"},
		{[]string{"list", "-addr", follower, "-id", "x"}, "not defined: -id"},
		{[]string{"frob"}, `unknown action "frob": want list, add, allow or remove`},
		{nil, "no action: want list, add, allow or remove"},
		{[]string{"allow", "-addr", follower}, "-id required"},
		{[]string{"list", "-addr", follower, "extra"}, "unexpected arguments"},
	} {
		if _, err := members(tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("members %q = %v, want an error with %q", tc.args, err, tc.want)
		}
	}

	// A killed member is shown unreachable, with why, within a few
	// probes; the living ones stay reachable.
	dead := (li + 2) % 3
	c.Kill(dead)
	deadRow := regexp.MustCompile(fmt.Sprintf(`(?m)^node%d\s.*\sUNREACHABLE\s+\S+ ago\s+\d+\s+\d+\s`, dead))
	waitMembers(t, follower, func(out string) bool {
		return deadRow.MatchString(out) && regexp.MustCompile(fmt.Sprintf(`(?m)^node%d: .*connection refused`, dead)).MatchString(out)
	})
	out, _ = members("list", "-addr", follower)
	t.Logf("members list after node%d was killed:\n%s", dead, out)

	// The leader killed too, then the dead follower restarted (a majority
	// again): the new leader's list shows the old leader unreachable, not
	// as the healthy voter it last knew, and so does the restarted node's,
	// which never reached it (last contact never).
	c.Kill(li)
	c.Restart(dead)
	nl, _ := c.Leader(t)
	oldLeader := regexp.MustCompile(fmt.Sprintf(`(?m)^node%d\s.*\sUNREACHABLE\s`, li))
	for _, i := range []int{nl, dead} {
		waitMembers(t, c.Node(i).AdminAddr(), func(out string) bool {
			return oldLeader.MatchString(out) && regexp.MustCompile(fmt.Sprintf(`(?m)^node%d\s.*\sself\s`, i)).MatchString(out)
		})
	}
	out, _ = members("list", "-addr", c.Node(nl).AdminAddr())
	t.Logf("the new leader's members list after the leader node%d was killed:\n%s", li, out)
}

// members -h lists every action's flags (what the runbook test reads), and
// each action's -h its own.
func TestMembersHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
		not  []string
	}{
		{[]string{"-h"}, []string{"-addr", "-timeout", "-id", "-raft-address", "-grpc-address", "-admin-address", "-token-file"}, nil},
		{[]string{"list", "-h"}, []string{"-addr", "-timeout", "-token-file"}, []string{"-id", "-raft-address"}},
		{[]string{"add", "-h"}, []string{"-addr", "-id", "-raft-address", "-grpc-address", "-admin-address"}, nil},
		{[]string{"remove", "-h"}, []string{"-addr", "-id"}, []string{"-raft-address"}},
		{[]string{"allow", "-h"}, []string{"-addr", "-id"}, []string{"-raft-address"}},
	} {
		var stderr bytes.Buffer
		if err := run(context.Background(), append([]string{"members"}, tc.args...), &bytes.Buffer{}, &stderr, noEnv); !errors.Is(err, flag.ErrHelp) {
			t.Errorf("members %q = %v, want flag.ErrHelp", tc.args, err)
		}
		for _, f := range tc.want {
			if !strings.Contains(stderr.String(), "\n  "+f+" ") {
				t.Errorf("members %q does not show %s:\n%s", tc.args, f, stderr.String())
			}
		}
		for _, f := range tc.not {
			if strings.Contains(stderr.String(), "\n  "+f+" ") {
				t.Errorf("members %q shows %s, which it does not take", tc.args, f)
			}
		}
	}
}

// waitMembers polls members list at addr until ok accepts its output.
func waitMembers(t *testing.T, addr string, ok func(string) bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var out bytes.Buffer
	for {
		out.Reset()
		err := run(context.Background(), []string{"members", "list", "-addr", addr}, &out, &bytes.Buffer{}, noEnv)
		if err == nil && ok(out.String()) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("members list at %s: %v\n%s", addr, err, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
