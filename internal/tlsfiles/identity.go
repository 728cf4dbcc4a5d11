package tlsfiles

import (
	"context"
	"crypto/x509"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// Role is what a certificate allows its holder to do. A certificate names
// its identities as URI SANs of the form ration://<role>/<name>; it may name
// several (a regional coordinator's names its node and its region). Only
// URI SANs count: a common name or DNS name never grants a role, so a
// server certificate issued for a host name authorizes nothing by itself.
type Role string

const (
	// RoleAgent: ration://agent/<id> may hold leases as holder <id>
	// (gateway-agent -id).
	RoleAgent Role = "agent"
	// RoleRegion: ration://region/<name> may hold leases as holder
	// region/<name>: a regional group's leader leasing from the global group.
	RoleRegion Role = "region"
	// RoleCoordinator: ration://coordinator/<id> may join the Raft group
	// (Raft transport, AddVoter through -join).
	RoleCoordinator Role = "coordinator"
	// RoleOperator: ration://operator/<name> may call the admin API.
	RoleOperator Role = "operator"
)

// URIScheme is the scheme of identity URIs.
const URIScheme = "ration"

// URI returns the identity URI of name in role, as a certificate carries it.
func URI(role Role, name string) string { return URIScheme + "://" + string(role) + "/" + name }

// Names returns the names cert holds in role, in SAN order.
func Names(cert *x509.Certificate, role Role) []string {
	var out []string
	for _, u := range cert.URIs {
		if u.Scheme != URIScheme || u.Host != string(role) || u.RawQuery != "" || u.Fragment != "" {
			continue
		}
		name := strings.TrimPrefix(u.Path, "/")
		if name != "" {
			out = append(out, name)
		}
	}
	return out
}

// Has reports whether cert names name in role.
func Has(cert *x509.Certificate, role Role, name string) bool {
	return slices.Contains(Names(cert, role), name)
}

// HasRole reports whether cert names anything in role.
func HasRole(cert *x509.Certificate, role Role) bool { return len(Names(cert, role)) > 0 }

// RequireRole is an Authorize admitting certificates that name something
// in one of roles.
func RequireRole(roles ...Role) Authorize {
	return func(leaf *x509.Certificate) error {
		for _, r := range roles {
			if HasRole(leaf, r) {
				return nil
			}
		}
		return fmt.Errorf("tlsfiles: certificate %q names no %v identity (URI SAN %s://<role>/<name>)", leaf.Subject.String(), roles, URIScheme)
	}
}

// PeerCertificate returns the client certificate of a gRPC call, or nil
// when the call came over plaintext or without one. A certificate it
// returns was verified during the handshake (ServerConfig's
// VerifyConnection): a handshake that fails verification never carries a
// call.
func PeerCertificate(ctx context.Context) *x509.Certificate {
	p, ok := peer.FromContext(ctx)
	if !ok || p.AuthInfo == nil {
		return nil
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		return nil
	}
	return ti.State.PeerCertificates[0]
}
