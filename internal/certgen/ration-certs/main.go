// Command ration-certs writes a development PKI (make certs): a CA and
// certificates for coordinators, agents and operators carrying their
// Ration identities (docs/security.md), made with Go's crypto alone, no
// network and no openssl. Production certificates come from your PKI.
//
//	go run ./internal/certgen/ration-certs -out certs -coordinators n1,n2,n3 -region eu -agents gw-1 -operators ops
//	go run ./internal/certgen/ration-certs -out certs -coordinators g0,g1,g2,eu-0@eu,us-0@us -agents eu-a1,us-a1
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
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o700); err != nil {
		return err
	}
	ca, err := certgen.NewCA("ration development CA", *validity)
	if err != nil {
		return err
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
	issue := func(file string, uris ...string) error {
		_, err := ca.WriteFiles(*out, file, certgen.Request{CommonName: file, URIs: uris, DNSNames: dns, IPs: ips, Validity: *validity})
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
	fmt.Fprintf(stdout, "%s  the CA bundle (-tls-ca) of every process\n", filepath.Join(*out, "ca.crt"))
	return nil
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
