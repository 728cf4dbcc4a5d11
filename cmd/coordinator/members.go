package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"

	"github.com/ration-dev/ration/internal/coordinator"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// membersActions are the actions of the members command, in the order
// its usage lists them.
var membersActions = []string{"list", "add", "allow", "remove"}

const membersUsage = `usage: coordinator members list -addr HOST:PORT
       coordinator members add -addr HOST:PORT -id ID -raft-address HOST:PORT -grpc-address HOST:PORT
                               -admin-address HOST:PORT
       coordinator members allow -addr HOST:PORT -id ID
       coordinator members remove -addr HOST:PORT -id ID

-addr is a member's admin address (its -admin). list asks that node for
the Raft servers it knows (its Status), with their lease and admin
addresses and their health as that node sees it: it probes each member's
admin address every second, and shows a member unreachable once two probes
in a row failed, with the last contact, the applied index and lag, the
version and the uptime each member last reported. add and remove change
the Raft configuration: they are sent to -addr and followed to the
leader's admin address. A server added is a non-voter until the leader
finds it caught up, then a voter. allow registers an id that may then join
by itself, with its own certificate (-join); remove also withdraws the
id's registration, so a removed member cannot add itself back. Add or
remove one server at a time, and list between changes (docs/runbook.md).

flags:`

// runMembers runs `coordinator members ACTION [flags]`: the Raft
// membership through the admin API (Status, AddVoter, RemoveServer).
func runMembers(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	action := ""
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		action, args = args[0], args[1:]
	}
	fs := flag.NewFlagSet("coordinator members "+action, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, membersUsage)
		fs.PrintDefaults()
	}
	addr, timeout, dial := bindAddr(fs)
	// Without an action (members -h) every action's flags are shown.
	var id, raftAddr, grpcAddr, adminAddr string
	if action != "list" {
		fs.StringVar(&id, "id", "", "the server's id (its coordinator -id); add, allow and remove")
	}
	if action == "add" || action == "" {
		fs.StringVar(&raftAddr, "raft-address", "", "the new server's Raft address, as the others reach it (its -raft); add")
		fs.StringVar(&grpcAddr, "grpc-address", "", "the new server's lease address, as agents and the others reach it (its -grpc-advertise or -grpc); add")
		fs.StringVar(&adminAddr, "admin-address", "", "the new server's admin address, as operators and the others reach it (its -admin-advertise or -admin); add")
	}
	want := fmt.Sprintf("want %s or %s", strings.Join(membersActions[:len(membersActions)-1], ", "), membersActions[len(membersActions)-1])
	if action != "" && !slices.Contains(membersActions, action) {
		return fmt.Errorf("members: unknown action %q: %s", action, want)
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if action == "" {
		return fmt.Errorf("members: no action: %s (coordinator members -h)", want)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("members %s: unexpected arguments %q", action, fs.Args())
	}
	var missing []string
	for _, f := range []struct {
		name, v string
		need    bool
	}{{"-id", id, action != "list"}, {"-raft-address", raftAddr, action == "add"}, {"-grpc-address", grpcAddr, action == "add"},
		{"-admin-address", adminAddr, action == "add"}} {
		if f.need && f.v == "" {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("members %s: %s required", action, strings.Join(missing, ", "))
	}

	cc, err := dial(*addr)
	if err != nil {
		return fmt.Errorf("members %s: -addr %q: %w", action, *addr, err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	admin := rationv1.NewAdminClient(cc)
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	defer w.Flush()

	if action == "list" {
		st, err := admin.Status(ctx, &rationv1.StatusRequest{})
		if err != nil {
			return fmt.Errorf("members of %s: %w", *addr, err)
		}
		if len(st.Servers) == 0 {
			// A node that has not joined, or was removed, knows no
			// configuration.
			return fmt.Errorf("members of %s: node %s (%s) knows no Raft configuration: it is not a member; ask a member", *addr, st.Id, st.State)
		}
		printMembers(w, st.Servers, st.LeaderId)
		return nil
	}

	// The change is made at the leader; its own Status (through the same
	// connection) names it, so the table can mark it.
	type changed struct {
		resp   *rationv1.MembershipResponse
		leader string
	}
	res, err := atLeader(ctx, admin, *addr, dial, func(ctx context.Context, admin rationv1.AdminClient, opt grpc.CallOption) (changed, error) {
		var resp *rationv1.MembershipResponse
		var err error
		switch action {
		case "add":
			resp, err = admin.AddVoter(ctx, &rationv1.AddVoterRequest{Id: id, RaftAddress: raftAddr, GrpcAddress: grpcAddr, AdminAddress: adminAddr}, opt)
		case "allow":
			resp, err = admin.AllowMember(ctx, &rationv1.AllowMemberRequest{Id: id}, opt)
		default:
			resp, err = admin.RemoveServer(ctx, &rationv1.RemoveServerRequest{Id: id}, opt)
		}
		if err != nil {
			return changed{}, err
		}
		c := changed{resp: resp}
		if st, err := admin.Status(ctx, &rationv1.StatusRequest{}); err == nil {
			c.leader = st.LeaderId
		}
		return c, nil
	})
	if err != nil {
		return fmt.Errorf("members %s %s at %s: %w", action, id, *addr, err)
	}
	switch action {
	case "add":
		fmt.Fprintf(w, "added %s: a non-voter until the leader finds it caught up, then a voter\n\n", id)
	case "allow":
		fmt.Fprintf(w, "registered %s: it may now join with its own certificate (-join)\n\n", id)
	default:
		fmt.Fprintf(w, "removed %s, and withdrew its registration\n\n", id)
	}
	if len(res.resp.Servers) == 0 {
		// RemoveServer of the leader itself: it steps down and knows no
		// configuration any more.
		fmt.Fprintln(w, "the leader removed itself: the others elect a new leader; list the members at one of them")
		return nil
	}
	printMembers(w, res.resp.Servers, res.leader)
	if len(res.resp.Allowed) > 0 {
		ids := make([]string, len(res.resp.Allowed))
		for i, a := range res.resp.Allowed {
			ids[i] = printable(a)
		}
		fmt.Fprintf(w, "\nregistered to join: %s\n", strings.Join(ids, ", "))
	}
	return nil
}

// printMembers prints the Raft servers with their lease and admin
// addresses ("-": not recorded), marking the leader, and their health as
// the answering node sees it; then why each member it cannot reach is
// unreachable.
func printMembers(w io.Writer, servers []*rationv1.RaftServer, leader string) {
	now := time.Now()
	fmt.Fprintln(w, "SERVER\tRAFT ADDRESS\tSUFFRAGE\tLEASE ADDRESS\tADMIN ADDRESS\tLEADER\tHEALTH\tLAST CONTACT\tAPPLIED\tLAG\tVERSION\tUPTIME")
	var notes []string
	for _, s := range servers {
		mark := ""
		if s.Id == leader {
			mark = "leader"
		}
		health, contact, applied, lag, uptime := orDash(printable(s.Health)), "-", "-", "-", "-"
		if s.Health == "unreachable" {
			health = "UNREACHABLE" // the one word a reader must not miss
		}
		switch {
		case s.Health == "self":
			health, contact = "self", "(this node)"
		case s.LastContactUnixUs != 0:
			contact = coordinator.FormatDuration(now.Sub(time.UnixMicro(s.LastContactUnixUs))) + " ago"
		case s.Health != "":
			contact = "never"
		}
		if s.Health == "self" || s.LastContactUnixUs != 0 {
			applied, lag = strconv.FormatUint(s.AppliedIndex, 10), strconv.FormatUint(s.Lag, 10)
		}
		if s.UptimeSeconds > 0 {
			uptime = coordinator.FormatDuration(time.Duration(s.UptimeSeconds * float64(time.Second)))
		}
		version := orDash(s.Version)
		if s.Commit != "" {
			version += " (" + printable(s.Commit) + ")"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", printable(s.Id), printable(s.Address), printable(s.Suffrage),
			orDash(s.GrpcAddress), orDash(s.AdminAddress), mark, health, contact, applied, lag, version, uptime)
		if s.ProbeError != "" {
			notes = append(notes, fmt.Sprintf("%s: %s", printable(s.Id), printable(s.ProbeError)))
		}
	}
	if len(notes) > 0 {
		fmt.Fprintln(w)
		for _, n := range notes {
			fmt.Fprintln(w, n)
		}
	}
}
