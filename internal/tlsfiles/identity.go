package tlsfiles

import (
	"context"
	"crypto/x509"
	"errors"
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
	// RoleCoordinator: ration://coordinator/<group>/<id> is member <id> of
	// coordinator group <group> (CoordinatorURI): it may take part in that
	// group's Raft (while <id> is in its configuration) and add itself
	// through -join, and nothing in any other group.
	RoleCoordinator Role = "coordinator"
	// RoleOperator: ration://operator/<name> may call the admin API.
	RoleOperator Role = "operator"
	// RoleGateway: ration://gateway/<name> may ask an agent for decisions
	// on listeners that require client certificates
	// (-listen-client-auth).
	RoleGateway Role = "gateway"
)

// URIScheme is the scheme of identity URIs.
const URIScheme = "ration"

// URI returns the identity URI of name in role, as a certificate carries it.
func URI(role Role, name string) string { return URIScheme + "://" + string(role) + "/" + name }

// Names returns the names cert holds in role, in SAN order. A URI of any
// other form than ration://<role>/<name> names nothing: user information
// (ration://agent@operator/ops is no operator, whichever part a reader
// would take for the role), a port, a query, a fragment, an opaque form
// (ration:agent/x) or percent-escapes that decode to other characters
// (ration://agent/a%2Fb).
func Names(cert *x509.Certificate, role Role) []string {
	var out []string
	for _, u := range cert.URIs {
		if u.Scheme != URIScheme || u.Host != string(role) || u.User != nil || u.Opaque != "" ||
			u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.RawFragment != "" || u.RawPath != "" {
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

// GlobalGroup is the name of the coordinator group that serves no region
// (a node without -region): the global group, which regional groups lease
// from. A regional group is named by its region.
const GlobalGroup = "global"

// Member is a coordinator identity scoped to its group: server id ID of
// the group Group.
type Member struct{ Group, ID string }

func (m Member) String() string { return m.Group + "/" + m.ID }

// CoordinatorURI returns the identity of server id of group:
// ration://coordinator/<group>/<id>.
func CoordinatorURI(group, id string) string { return URI(RoleCoordinator, group+"/"+id) }

// Members returns the scoped coordinator identities cert names, in SAN
// order. A name without a group (ration://coordinator/<id>, the form
// before identities were scoped to their group) is none: it cannot say
// which group's member it is, and every group's pods have the same ids.
func Members(cert *x509.Certificate) []Member {
	var out []Member
	for _, name := range Names(cert, RoleCoordinator) {
		group, id, ok := strings.Cut(name, "/")
		if ok && group != "" && id != "" {
			out = append(out, Member{Group: group, ID: id})
		}
	}
	return out
}

// MemberIDs returns the server ids cert names in group.
func MemberIDs(cert *x509.Certificate, group string) []string {
	var out []string
	for _, m := range Members(cert) {
		if m.Group == group {
			out = append(out, m.ID)
		}
	}
	return out
}

// ErrNotCoordinator marks a peer whose certificate does not name the
// coordinator the caller needs (of its group, or that member).
var ErrNotCoordinator = errors.New("not the coordinator expected")

// RequireCoordinator is an Authorize admitting a certificate that names a
// member of one of groups (ration://coordinator/<group>/<id>), or of any
// group when group is "". Every client of a coordinator checks it before
// it sends anything (an admin token, a renewal): a certificate of another
// role, even of the same CA, is not a coordinator.
func RequireCoordinator(group string, more ...string) Authorize {
	groups := append([]string{group}, more...)
	return func(leaf *x509.Certificate) error {
		for _, m := range Members(leaf) {
			if group == "" || slices.Contains(groups, m.Group) {
				return nil
			}
		}
		return fmt.Errorf("%w: certificate %q names coordinators %q, not one of group %s (URI SAN %s)",
			ErrNotCoordinator, leaf.Subject.String(), Names(leaf, RoleCoordinator), strings.Join(quoteAll(groups), " or "), CoordinatorURI(groupOrAny(group), "<id>"))
	}
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = fmt.Sprintf("%q", groupOrAny(s))
	}
	return out
}

// RequireMember is an Authorize admitting a certificate that names server
// id of group.
func RequireMember(group, id string) Authorize {
	return func(leaf *x509.Certificate) error {
		if slices.Contains(MemberIDs(leaf, group), id) {
			return nil
		}
		return fmt.Errorf("%w: certificate %q names coordinators %q, not %s",
			ErrNotCoordinator, leaf.Subject.String(), Names(leaf, RoleCoordinator), CoordinatorURI(group, id))
	}
}

func groupOrAny(group string) string {
	if group == "" {
		return "<group>"
	}
	return group
}
