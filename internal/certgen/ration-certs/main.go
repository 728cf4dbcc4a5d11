// Command ration-certs writes a PKI for Ration (make certs): a CA and
// certificates for coordinators, agents, operators and gateways carrying
// their Ration identities (docs/security.md), made with Go's crypto alone,
// no network and no openssl. It keeps the CA (ca.crt, and ca.key with
// mode 0600), so that -add issues more certificates from it later: a new
// agent, member, region or operator joins without a new PKI and without a
// restart of the processes already running. Whoever reads ca.key can
// issue any identity the PKI's processes trust: keep it where only the
// operator reads it, or delete it when no more certificates are needed.
// For production, your PKI (cert-manager) is the better issuer.
//
//	go run ./internal/certgen/ration-certs -out certs -coordinators n1,n2,n3 -region eu -agents gw-1 -operators ops
//	go run ./internal/certgen/ration-certs -out certs -coordinators g0,g1,g2,eu-0@eu,us-0@us -agents eu-a1,us-a1
//	go run ./internal/certgen/ration-certs -out certs -add -agents gw-2       # one more, from certs/ca.key
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ration-dev/ration/internal/certgen"
	"github.com/ration-dev/ration/internal/tlsfiles"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "ration-certs:", err)
		}
		os.Exit(2)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("ration-certs", flag.ContinueOnError)
	out := fs.String("out", "certs", "directory to write to (created)")
	coords := fs.String("coordinators", "dev", "coordinator ids, comma separated: ration://coordinator/global/<id> (a member of the global group, or of a group without -region); id@region is a member of that region's group, ration://coordinator/<region>/<id>, and also names ration://region/<region>")
	reg := fs.String("region", "", "region of the coordinators without an @region (adds ration://region/<region> to theirs)")
	agents := fs.String("agents", "dev", "agent ids, comma separated: ration://agent/<id>")
	ops := fs.String("operators", "ops", "operator names, comma separated: ration://operator/<name>")
	gws := fs.String("gateways", "dev", "gateway names, comma separated: ration://gateway/<name> (the client certificates an agent with -listen-client-auth admits)")
	hosts := fs.String("hosts", "localhost,127.0.0.1", "DNS names and IP addresses every certificate is valid for (the names processes are dialed by)")
	validity := fs.Duration("validity", 30*24*time.Hour, "validity of the certificates")
	caValidity := fs.Duration("ca-validity", 365*24*time.Hour, "validity of a new CA: certificates issued later by -add end with it at the latest")
	add := fs.Bool("add", false, "issue from the CA already in -out (ca.crt, ca.key) only the certificates named by -coordinators, -agents, -operators and -gateways (the others default to none), rather than making a new CA")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q (flags only; see -h)", fs.Args())
	}
	ca, err := openCA(*out, *add, *caValidity)
	if err != nil {
		return err
	}
	if *add {
		// Only what is named: the defaults are for a first PKI.
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		for name, v := range map[string]*string{"coordinators": coords, "agents": agents, "operators": ops, "gateways": gws} {
			if !set[name] {
				*v = ""
			}
		}
		if *coords == "" && *agents == "" && *ops == "" && *gws == "" {
			return errors.New("-add: name the certificates to issue (-coordinators, -agents, -operators or -gateways)")
		}
	}
	var dns []string
	var ips []net.IP
	for _, h := range split(*hosts) {
		if ip := net.ParseIP(h); ip != nil {
			ips = append(ips, ip)
		} else {
			dns = append(dns, h)
		}
	}
	// A certificate cannot outlive its CA: it would stop verifying then
	// however long it claims to be valid.
	notAfter := time.Now().Add(*validity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
		fmt.Fprintf(stdout, "note: the CA expires %s: the certificates end then, before -validity %v\n", notAfter.UTC().Format(time.RFC3339), *validity)
	}
	issue := func(file string, uris ...string) error {
		_, err := ca.WriteFiles(*out, file, certgen.Request{CommonName: file, URIs: uris, DNSNames: dns, IPs: ips, NotAfter: notAfter})
		if err == nil {
			fmt.Fprintf(stdout, "%s.crt %s.key  %s\n", filepath.Join(*out, file), filepath.Join(*out, file), strings.Join(uris, " "))
		}
		return err
	}
	for _, c := range split(*coords) {
		id, region, ok := strings.Cut(c, "@")
		if !ok {
			region = *reg
		}
		if id == "" || (ok && region == "") {
			return fmt.Errorf("-coordinators: %q: want id or id@region", c)
		}
		// The group is the node's -region, or global without one: what
		// the coordinator checks its own certificate against.
		group := region
		if group == "" {
			group = tlsfiles.GlobalGroup
		}
		uris := []string{tlsfiles.CoordinatorURI(group, id)}
		if region != "" {
			uris = append(uris, tlsfiles.URI(tlsfiles.RoleRegion, region))
		}
		if err := issue("coordinator-"+id, uris...); err != nil {
			return err
		}
	}
	for _, id := range split(*agents) {
		if err := issue("agent-"+id, tlsfiles.URI(tlsfiles.RoleAgent, id)); err != nil {
			return err
		}
	}
	for _, name := range split(*ops) {
		if err := issue("operator-"+name, tlsfiles.URI(tlsfiles.RoleOperator, name)); err != nil {
			return err
		}
	}
	for _, name := range split(*gws) {
		if err := issue("gateway-"+name, tlsfiles.URI(tlsfiles.RoleGateway, name)); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "%s  the CA bundle (-tls-ca) of every process\n", filepath.Join(*out, certgen.CACertFile))
	if !*add {
		fmt.Fprintf(stdout, "%s  the CA's private key (mode 0600): WARNING: whoever reads it can issue any identity these processes trust;\n"+
			"  keep it where only you read it, and delete it once no more certificates are needed (ration-certs -add issues more from it)\n",
			filepath.Join(*out, certgen.CAKeyFile))
	}
	return nil
}

// openCA makes a new CA in dir, or with add loads the one there. A new
// CA is refused where one is kept: replacing it would leave every process
// of the old PKI unable to verify the new certificates, and the old ones
// orphaned; the error says both ways on.
func openCA(dir string, add bool, validity time.Duration) (*certgen.CA, error) {
	keyPath := filepath.Join(dir, certgen.CAKeyFile)
	if add {
		ca, err := certgen.LoadCA(dir)
		if err != nil {
			return nil, fmt.Errorf("-add: %w (-add issues from the CA a run without -add kept in -out %s)", err, dir)
		}
		return ca, nil
	}
	if _, err := os.Stat(keyPath); err == nil {
		return nil, fmt.Errorf("%s holds a CA already (%s): -add issues more certificates from it; for a new PKI, remove %s first (every process must then get the new ca.crt)", dir, keyPath, dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ca, err := certgen.NewCA("ration development CA", validity)
	if err != nil {
		return nil, err
	}
	if err := ca.WriteCA(dir); err != nil {
		return nil, err
	}
	return ca, nil
}

func split(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
