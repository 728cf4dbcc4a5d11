package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// tlsFiles are the -tls-* flags: the agent's listeners serve TLS when it
// runs with -listen-tls, and require a client certificate with
// -listen-client-auth (docs/security.md).
type tlsFiles struct {
	CA         string // -tls-ca: turns TLS on; the agent's certificate must chain to it
	Cert       string // -tls-cert: client certificate, for -listen-client-auth
	Key        string // -tls-key: its private key
	ServerName string // -tls-server-name: the name verified instead of the target's host
}

func (f tlsFiles) enabled() bool { return f.CA != "" }

// check reports flags given without the ones they need.
func (f tlsFiles) check() []error {
	var errs []error
	if (f.Cert == "") != (f.Key == "") {
		errs = append(errs, errors.New("-tls-cert and -tls-key: give both (the client certificate and its key) or neither"))
	}
	if f.CA == "" {
		if f.Cert != "" || f.Key != "" {
			errs = append(errs, errors.New("-tls-cert/-tls-key need -tls-ca (TLS is on when -tls-ca names the CA the agent's certificate chains to)"))
		}
		if f.ServerName != "" {
			errs = append(errs, errors.New("-tls-server-name needs -tls-ca"))
		}
	}
	return errs
}

// config reads the files into a client config: the agent's certificate is
// verified against -tls-ca and the target's host (or -tls-server-name),
// and the client certificate is presented when the agent asks for one.
// Nil without -tls-ca. Every problem with the files is reported, naming
// the flag and the file.
func (f tlsFiles) config() (*tls.Config, error) {
	if !f.enabled() {
		return nil, nil
	}
	var errs []error
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.ServerName}
	if b, err := os.ReadFile(f.CA); err != nil {
		errs = append(errs, fmt.Errorf("-tls-ca: %w", err))
	} else {
		cfg.RootCAs = x509.NewCertPool()
		if !bytes.Contains(b, []byte("-----BEGIN CERTIFICATE-----")) || !cfg.RootCAs.AppendCertsFromPEM(b) {
			errs = append(errs, fmt.Errorf("-tls-ca %s: no PEM certificate in it (want the CA bundle, e.g. certs/ca.crt of make certs)", f.CA))
		}
	}
	if f.Cert != "" && f.Key != "" {
		cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			errs = append(errs, fmt.Errorf("-tls-cert %s, -tls-key %s: %w", f.Cert, f.Key, err))
		} else {
			cfg.Certificates = []tls.Certificate{cert}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return cfg, nil
}

// describeTLS names what a connection negotiated, for the report:
// "TLS 1.3 TLS_AES_128_GCM_SHA256, client certificate".
func describeTLS(cs tls.ConnectionState, clientCert bool) string {
	s := tls.VersionName(cs.Version) + " " + tls.CipherSuiteName(cs.CipherSuite)
	if clientCert {
		s += ", client certificate"
	}
	return s
}

// dialHint is what to check when the preflight call fails: most often a
// plaintext client against a -listen-tls agent or the other way round.
func (f tlsFiles) dialHint() string {
	switch {
	case !f.enabled():
		return "is a gateway-agent listening there, in plaintext? One started with -listen-tls needs -tls-ca"
	case f.Cert == "":
		return "is a gateway-agent listening there with -listen-tls, with a certificate of -tls-ca for that name? One with -listen-client-auth also needs -tls-cert and -tls-key"
	default:
		return "is a gateway-agent listening there with -listen-tls, with a certificate of -tls-ca for that name, and does it accept -tls-cert?"
	}
}

// scheme is the HTTP URL scheme of -mode http.
func (f tlsFiles) scheme() string {
	if f.enabled() {
		return "https"
	}
	return "http"
}
