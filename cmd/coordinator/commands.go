package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/tlsfiles"
	"github.com/ration-dev/ration/internal/tokenfile"

	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// commands are the operator commands; the usage text names each
// (TestUsageNamesEveryCommand).
var commands = []string{"status", "quotas", "leases", "tune", "tunings", "members"}

// runCommand runs an operator command against one node's admin API (its
// -admin listener). It asks that node, not the leader: status shows what
// the node itself sees, and quotas and leases read its replicated state (a
// follower's may lag by the entries it has not applied).
func runCommand(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	return tlsHint(runOne(ctx, name, args, stdout, stderr))
}

// tlsHint says what a TLS mismatch between the command and the node most
// likely is: gRPC reports a plaintext client refused by a TLS node only
// as "error reading server preface: EOF" (the node drops the connection
// at the first bytes, which are no TLS handshake), and a TLS client at a
// plaintext node as a record that "does not look like a TLS handshake".
func tlsHint(err error) error {
	if err == nil {
		return nil
	}
	switch msg := err.Error(); {
	case strings.Contains(msg, "error reading server preface"):
		return fmt.Errorf("%w\nhint: the node closed the connection at once, as a node with TLS does to a plaintext client: pass an operator's certificate with -tls-cert, -tls-key and -tls-ca (or RATION_TLS_CERT, RATION_TLS_KEY, RATION_TLS_CA; docs/security.md)", err)
	case strings.Contains(msg, "first record does not look like a TLS handshake"):
		return fmt.Errorf("%w\nhint: the node answers in plaintext (it runs with -insecure or -dev): leave out -tls-cert, -tls-key and -tls-ca (and unset RATION_TLS_*)", err)
	}
	return err
}

func runOne(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	if name == "members" {
		return runMembers(ctx, args, stdout, stderr) // members.go
	}
	fs := flag.NewFlagSet("coordinator "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr, timeout, dial := bindAddr(fs)
	quota := new(string)
	if name == "leases" {
		quota = fs.String("quota", "", "only the leases of this quota (rule|subject)")
	}
	var tf tuneFlags
	if name == "tune" {
		tf.bind(fs)
	}
	if !slices.Contains(commands, name) {
		return fmt.Errorf("unknown command %q: want %s or %s (or flags: see -h)", name,
			strings.Join(commands[:len(commands)-1], ", "), commands[len(commands)-1])
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	var tuneReq *rationv1.TuneRequest
	if name == "tune" {
		var err error
		if tuneReq, err = tf.request(fs); err != nil {
			return err
		}
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected arguments %q", name, fs.Args())
	}
	cc, err := dial(*addr)
	if err != nil {
		return fmt.Errorf("%s: -addr %q: %w", name, *addr, err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	admin := rationv1.NewAdminClient(cc)
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	defer w.Flush()
	switch name {
	case "status":
		st, err := admin.Status(ctx, &rationv1.StatusRequest{})
		if err != nil {
			return fmt.Errorf("status of %s: %w", *addr, err)
		}
		fmt.Fprintf(w, "node\t%s\t%s\n", printable(st.Id), printable(st.State))
		fmt.Fprintf(w, "leader\t%s\t%s\n", orDash(st.LeaderId), orDash(st.LeaderAddress))
		fmt.Fprintf(w, "leader admin\t%s\t\n", orDash(st.LeaderAdminAddress))
		fmt.Fprintf(w, "term\t%d\t\n", st.Term)
		fmt.Fprintf(w, "commit / applied\t%d / %d\t\n", st.CommitIndex, st.AppliedIndex)
		fmt.Fprintf(w, "last snapshot\t%d\t\n\n", st.LastSnapshotIndex)
		fmt.Fprintln(w, "SERVER\tRAFT ADDRESS\tSUFFRAGE\tLEASE ADDRESS\tADMIN ADDRESS")
		for _, s := range st.Servers {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", printable(s.Id), printable(s.Address), printable(s.Suffrage), orDash(s.GrpcAddress), orDash(s.AdminAddress))
		}
		if tl, err := admin.ListTunings(ctx, &rationv1.ListTuningsRequest{}); err == nil && len(tl.Tunings) > 0 {
			fmt.Fprintln(w)
			printTunings(w, tl.Tunings)
		}
	case "tunings":
		tl, err := admin.ListTunings(ctx, &rationv1.ListTuningsRequest{})
		if err != nil {
			return fmt.Errorf("tunings of %s: %w", *addr, err)
		}
		printTunings(w, tl.Tunings)
	case "tune":
		resp, err := atLeader(ctx, admin, *addr, dial, func(ctx context.Context, admin rationv1.AdminClient, opt grpc.CallOption) (*rationv1.TuneResponse, error) {
			return admin.Tune(ctx, tuneReq, opt)
		})
		if err != nil {
			return fmt.Errorf("tune at %s: %w", *addr, err)
		}
		if tuneReq.Clear {
			printCleared(w, tuneReq.Tuning, resp.Tuning)
			return nil
		}
		printTunings(w, []*rationv1.Tuning{resp.Tuning})
	case "quotas":
		resp, err := admin.ListQuotas(ctx, &rationv1.ListQuotasRequest{})
		if err != nil {
			return fmt.Errorf("quotas of %s: %w", *addr, err)
		}
		fmt.Fprintln(w, "QUOTA\tBURST\tRATE\tPOOL\tLEASED CAP\tLEASED RATE\tLEASES")
		for _, q := range resp.Quotas {
			fmt.Fprintf(w, "%s\t%s\t%s\t%.2f\t%.2f\t%.3f\t%d\n", printable(q.Quota), num(q.Burst), num(q.Rate), q.Pool, q.LeasedCap, q.LeasedRate, q.Leases)
		}
	case "leases":
		resp, err := admin.ListLeases(ctx, &rationv1.ListLeasesRequest{Quota: *quota})
		if err != nil {
			return fmt.Errorf("leases of %s: %w", *addr, err)
		}
		fmt.Fprintln(w, "LEASE\tQUOTA\tHOLDER\tCAP\tRATE\tDEMAND\tEXPIRY\tRECLAIM")
		for _, l := range resp.Leases {
			fmt.Fprintf(w, "%d\t%s\t%s\t%.2f\t%.3f\t%.3f\t%s\t%s\n", l.LeaseId, printable(l.Quota), printable(l.Holder), l.Cap, l.Rate, l.Demand,
				usTime(l.ExpiryUnixUs), usTime(l.ReclaimUnixUs))
		}
	}
	return nil
}

// dialFunc opens a connection to a node's admin API.
type dialFunc func(addr string) (*grpc.ClientConn, error)

// defaultAdminAddr is where the commands look for a node's admin API: a
// node's -admin default, on the same host.
const defaultAdminAddr = "127.0.0.1:8303"

// bindAddr binds the flags every command has: the node to ask (its admin
// address), the deadline, the operator's certificate (-tls-cert, -tls-key,
// -tls-ca, defaulting to RATION_TLS_CERT, RATION_TLS_KEY and RATION_TLS_CA,
// as on the node) and the admin token (-token-file, defaulting to
// RATION_ADMIN_TOKEN_FILE, the node's variable). Without the TLS files the
// command dials in plaintext, which a node running with TLS refuses.
func bindAddr(fs *flag.FlagSet) (addr *string, timeout *time.Duration, dial dialFunc) {
	addr = fs.String("addr", defaultAdminAddr, "admin address (-admin) of a coordinator node")
	timeout = fs.Duration("timeout", 5*time.Second, "deadline for the call")
	var files tlsfiles.Files
	fs.StringVar(&files.Cert, "tls-cert", os.Getenv("RATION_TLS_CERT"), "operator's PEM certificate (URI SAN ration://operator/<name>) (env RATION_TLS_CERT)")
	fs.StringVar(&files.Key, "tls-key", os.Getenv("RATION_TLS_KEY"), "PEM private key of -tls-cert (env RATION_TLS_KEY)")
	fs.StringVar(&files.CA, "tls-ca", os.Getenv("RATION_TLS_CA"), "PEM CA bundle the node's certificate must chain to (env RATION_TLS_CA)")
	serverName := fs.String("tls-server-name", "", "name the node's certificate must carry, when it is not -addr's host (through kubectl port-forward: -addr 127.0.0.1:8303 -tls-server-name coordinator-0.ration.svc)")
	tokenFile := fs.String("token-file", os.Getenv("RATION_ADMIN_TOKEN_FILE"), "file holding the node's admin token (its -admin-token-file), sent as authorization: Bearer (env RATION_ADMIN_TOKEN_FILE)")
	dial = func(a string) (*grpc.ClientConn, error) {
		creds := insecure.NewCredentials()
		if files.Enabled() {
			// A command runs once: the files are read once.
			src, err := tlsfiles.Open(files, tlsfiles.Options{Interval: time.Hour})
			if err != nil {
				return nil, err
			}
			defer src.Close()
			// The token (below) goes only over a connection whose server
			// named a coordinator at the handshake: per-call credentials
			// are sent after it.
			creds = src.ClientCredentials(*serverName, tlsfiles.RequireCoordinator(""))
		} else if *serverName != "" {
			return nil, fmt.Errorf("-tls-server-name %q without -tls-cert, -tls-key, -tls-ca", *serverName)
		}
		opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
		if *tokenFile != "" {
			tok, err := tokenfile.Read(*tokenFile)
			if err != nil {
				return nil, fmt.Errorf("-token-file: %w", err)
			}
			opts = append(opts, grpc.WithPerRPCCredentials(tokenfile.Bearer(tok)))
		}
		return grpc.NewClient(a, opts...)
	}
	return addr, timeout, dial
}

func orDash(s string) string {
	if strings.TrimSpace(s) == "" {
		return "-"
	}
	return printable(s)
}

// printable escapes what a terminal would act on rather than show in a
// name the server sends (a holder or subject comes from clients): control
// characters (ESC sequences can rewrite the screen, retitle the window,
// hide a line), bidirectional overrides (which reorder what is read), and
// bytes that are not UTF-8. Tabs and newlines are escaped too: they would
// break the table's columns and rows.
func printable(s string) string {
	clean := true
	for _, r := range s {
		if !safeRune(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i, r := range s {
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD"):
			fmt.Fprintf(&b, "\\x%02x", s[i])
		case safeRune(r):
			b.WriteRune(r)
		case r < 0x100:
			fmt.Fprintf(&b, "\\x%02x", r)
		default:
			fmt.Fprintf(&b, "\\u%04x", r)
		}
	}
	return b.String()
}

func safeRune(r rune) bool {
	return r != utf8.RuneError && !unicode.IsControl(r) && !unicode.Is(unicode.Bidi_Control, r) && r != '\\'
}

func usTime(us int64) string {
	return time.UnixMicro(us).UTC().Format("15:04:05.000")
}

// tuneFlags are the flags of the tune command. A knob is sent only when its
// flag is given, so an operator changes one setting without restating the
// others.
type tuneFlags struct {
	rule, region      string
	period            time.Duration
	renewAt, min, max float64
	weight            float64
	safe              float64
	clear, overshoot  bool
}

func (f *tuneFlags) bind(fs *flag.FlagSet) {
	fs.StringVar(&f.rule, "rule", "", "rule to tune (required)")
	fs.StringVar(&f.region, "region", "", "region to tune (default: every region of the rule)")
	fs.DurationVar(&f.period, "lease-period", 0, "lease length D")
	fs.Float64Var(&f.renewAt, "renew-at", 0, "upstream renew point, fraction of a lease's validity in (0, 1) (regional group)")
	fs.Float64Var(&f.min, "min-slice", 0, "minimum rate slice, tokens/s")
	fs.Float64Var(&f.max, "max-slice", 0, "maximum rate slice, tokens/s (0: no maximum)")
	fs.Float64Var(&f.weight, "weight", 0, "the region's fairness weight (global group)")
	fs.Float64Var(&f.safe, "safe-share", 0, "the region's safe share, tokens/s (global group; takes effect in two phases, see docs/operations.md)")
	fs.BoolVar(&f.overshoot, "allow-overshoot", false, "accept a safe share that makes the rule's safe shares sum above its rate")
	fs.BoolVar(&f.clear, "clear", false, "remove the tuning of -rule and -region instead (a safe share stays)")
}

func (f *tuneFlags) request(fs *flag.FlagSet) (*rationv1.TuneRequest, error) {
	t := &rationv1.Tuning{Rule: f.rule, Region: f.region}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if set["lease-period"] {
		ms := f.period.Milliseconds()
		t.LeasePeriodMs = &ms
	}
	if set["renew-at"] {
		t.RenewAt = &f.renewAt
	}
	if set["min-slice"] {
		t.MinSlice = &f.min
	}
	if set["max-slice"] {
		t.MaxSlice = &f.max
	}
	if set["weight"] {
		t.Weight = &f.weight
	}
	if set["safe-share"] {
		t.SafeShare = &f.safe
	}
	if f.rule == "" {
		return nil, fmt.Errorf("tune: -rule is required")
	}
	return &rationv1.TuneRequest{Tuning: t, Clear: f.clear, AllowOvershoot: f.overshoot}, nil
}

func printTunings(w io.Writer, ts []*rationv1.Tuning) {
	fmt.Fprintln(w, "RULE\tREGION\tLEASE PERIOD\tRENEW AT\tMIN SLICE\tMAX SLICE\tWEIGHT\tSAFE SHARE")
	opt := func(v *float64) string {
		if v == nil {
			return "-"
		}
		return num(*v)
	}
	for _, t := range ts {
		period := "-"
		if t.LeasePeriodMs != nil {
			period = (time.Duration(*t.LeasePeriodMs) * time.Millisecond).String()
		}
		safe := opt(t.SafeShare)
		if t.SafeSharePendingFrom != nil {
			safe += " (pending from " + opt(t.SafeSharePendingFrom) + ")"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", printable(t.Rule), orDash(t.Region), period, opt(t.RenewAt), opt(t.MinSlice), opt(t.MaxSlice), opt(t.Weight), safe)
	}
}

// num writes a rate or amount as the status page does: at most three
// decimals (a rate of 100/3 is 33.333, not 33.333333333333336).
func num(v float64) string { return coordinator.FormatNumber(v) }

// printCleared says which tuning -clear removed, then what is in force for
// the rule and region now: the rule's default tuning, a safe share (which
// -clear keeps), or the rules file's settings. Printing the effective
// tuning as the command's only row read as if nothing had been removed.
func printCleared(w io.Writer, req, eff *rationv1.Tuning) {
	what := "rule " + printable(req.Rule)
	if req.Region != "" {
		what += ", region " + printable(req.Region)
	} else {
		what += " (its default for every region)"
	}
	fmt.Fprintf(w, "cleared the tuning of %s\n", what)
	if eff == nil || eff.LeasePeriodMs == nil && eff.RenewAt == nil && eff.MinSlice == nil && eff.MaxSlice == nil &&
		eff.Weight == nil && eff.SafeShare == nil {
		fmt.Fprintln(w, "in force now: the rules file's lease settings")
		return
	}
	fmt.Fprintln(w, "in force now (the rule's default tuning, and a safe share, which -clear keeps):")
	fmt.Fprintln(w)
	printTunings(w, []*rationv1.Tuning{eff})
}

// atLeader makes a call only the leader serves (Tune, AddVoter,
// RemoveServer): a node that is not the leader (or leads but is not ready
// yet) answers UNAVAILABLE naming the leader's admin address, and the call
// is made there, until the deadline. opt must be passed to the RPC: it reads the trailer.
// A call may so reach the state machine twice: a Tune sets the same record
// twice, an AddVoter of a voter at the same address is a no-op.
func atLeader[T any](ctx context.Context, admin rationv1.AdminClient, addr string, dial dialFunc,
	call func(ctx context.Context, admin rationv1.AdminClient, opt grpc.CallOption) (T, error)) (T, error) {
	var zero T
	for {
		var md metadata.MD
		resp, err := call(ctx, admin, grpc.Trailer(&md))
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			return resp, err
		}
		if l := md.Get(coordinator.LeaderTrailer); len(l) > 0 && l[0] != "" && l[0] != addr {
			cc, cerr := dial(l[0])
			if cerr != nil {
				return zero, fmt.Errorf("leader %q: %w", l[0], cerr)
			}
			defer cc.Close()
			admin, addr = rationv1.NewAdminClient(cc), l[0]
		}
		select {
		case <-ctx.Done():
			return zero, err
		case <-time.After(100 * time.Millisecond):
		}
	}
}
