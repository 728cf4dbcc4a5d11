package tlsfiles

import (
	"context"
	"net"

	"google.golang.org/grpc/credentials"
)

// ServerCredentials are gRPC server credentials for mutual TLS with the
// current material (ServerConfig).
func (s *Source) ServerCredentials(authorize Authorize) credentials.TransportCredentials {
	return credentials.NewTLS(s.ServerConfig(authorize))
}

// ClientCredentials are gRPC client credentials for mutual TLS with the
// current material. Each handshake verifies the server against the host of
// the address dialed (or serverName when set), which is why it wraps
// credentials.NewTLS rather than being one: a config made once could not
// know the address of every connection a client opens (a redirect to the
// leader dials a new one).
func (s *Source) ClientCredentials(serverName string, authorize Authorize) credentials.TransportCredentials {
	return &clientCreds{s: s, serverName: serverName, authorize: authorize}
}

type clientCreds struct {
	s          *Source
	serverName string
	authorize  Authorize
}

func (c *clientCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	name := c.serverName
	if name == "" {
		name = HostOf(authority)
	}
	return credentials.NewTLS(c.s.ClientConfig(name, c.authorize)).ClientHandshake(ctx, authority, raw)
}

func (c *clientCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return credentials.NewTLS(c.s.ServerConfig(nil)).ServerHandshake(raw)
}

func (c *clientCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls", SecurityVersion: "1.2", ServerName: c.serverName}
}

func (c *clientCreds) Clone() credentials.TransportCredentials {
	cc := *c
	return &cc
}

// OverrideServerName is deprecated in gRPC; it sets the name verified.
func (c *clientCreds) OverrideServerName(name string) error {
	c.serverName = name
	return nil
}
