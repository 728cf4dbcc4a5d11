// Package certgen makes certificate authorities and certificates with
// Go's crypto alone (no network, no openssl): the tests' ephemeral PKI and
// cmd/ration-certs (make certs), which writes a development PKI to disk.
// Keys are ECDSA P-256. Production certificates should come from the
// operator's PKI (cert-manager, deploy/kubernetes/certificates.yaml).
package certgen

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority that can issue certificates.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	// CertPEM is Cert encoded, as a -tls-ca file holds it.
	CertPEM []byte
}

// NewCA makes a self-signed CA named name, valid for validity from an
// hour ago (so that small clock offsets between machines do not matter).
func NewCA(name string, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certgen: CA key: %w", err)
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("certgen: CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("certgen: CA certificate: %w", err)
	}
	return &CA{Cert: cert, Key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// Request describes one certificate to issue.
type Request struct {
	CommonName string
	// URIs are the identities (ration://agent/<id>, ration://coordinator/<group>/<id>,
	// ration://region/<name>, ration://operator/<name>: docs/security.md).
	URIs []string
	// DNSNames and IPs are the names clients dial the holder by: a server
	// certificate must carry every name and address it is reached at.
	DNSNames []string
	IPs      []net.IP
	Validity time.Duration // default 24h
	// NotAfter, when set, ends the validity instead of Validity: a test's
	// expired certificate.
	NotAfter time.Time
}

// Issue signs a certificate for r, usable as both TLS server and TLS
// client (every Ration process is both: a coordinator serves agents and
// dials its peers). It returns the certificate and its key, PEM encoded.
func (ca *CA) Issue(r Request) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("certgen: key: %w", err)
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, nil, err
	}
	validity := r.Validity
	if validity <= 0 {
		validity = 24 * time.Hour
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: r.CommonName},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     r.DNSNames,
		IPAddresses:  r.IPs,
	}
	if !r.NotAfter.IsZero() {
		tmpl.NotAfter = r.NotAfter
		if b := r.NotAfter.Add(-time.Hour); b.Before(tmpl.NotBefore) {
			tmpl.NotBefore = b
		}
	}
	for _, s := range r.URIs {
		u, err := url.Parse(s)
		if err != nil {
			return nil, nil, fmt.Errorf("certgen: URI %q: %w", s, err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("certgen: certificate: %w", err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("certgen: key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

func serialNumber() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		return nil, fmt.Errorf("certgen: serial number: %w", err)
	}
	return n, nil
}

// File names of a CA kept on disk (WriteCA, LoadCA): its certificate, the
// -tls-ca bundle of every process, and its private key.
const (
	CACertFile = "ca.crt"
	CAKeyFile  = "ca.key"
)

// WriteCA writes the CA's certificate (0644) and private key (0600) to
// dir, so that LoadCA can issue more certificates from it later. Whoever
// reads the key can issue any identity every process of the PKI trusts.
func (ca *CA) WriteCA(dir string) error {
	kder, err := x509.MarshalECPrivateKey(ca.Key)
	if err != nil {
		return fmt.Errorf("certgen: CA key: %w", err)
	}
	if err := writeFile(filepath.Join(dir, CACertFile), ca.CertPEM, 0o644); err != nil {
		return fmt.Errorf("certgen: %w", err)
	}
	if err := writeFile(filepath.Join(dir, CAKeyFile), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return fmt.Errorf("certgen: %w", err)
	}
	return nil
}

// LoadCA reads a CA written by WriteCA from dir. The certificate must be
// a CA's and the key its own: a mismatched pair would sign certificates
// that chain to nothing the processes trust.
func LoadCA(dir string) (*CA, error) {
	certPath, keyPath := filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile)
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("certgen: CA certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("certgen: CA key: %w", err)
	}
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("certgen: %s: no PEM CERTIFICATE block", certPath)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("certgen: %s: %w", certPath, err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("certgen: %s: not a CA certificate", certPath)
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil || kb.Type != "EC PRIVATE KEY" {
		return nil, fmt.Errorf("certgen: %s: no PEM EC PRIVATE KEY block", keyPath)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("certgen: %s: %w", keyPath, err)
	}
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok || !pub.Equal(&key.PublicKey) {
		return nil, fmt.Errorf("certgen: %s is not the key of %s", keyPath, certPath)
	}
	return &CA{Cert: cert, Key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})}, nil
}

// Paths are the files WriteFiles wrote.
type Paths struct{ Cert, Key, CA string }

// WriteFiles issues a certificate for r and writes it, its key (mode 0600)
// and the CA certificate to dir as name.crt, name.key and ca.crt.
func (ca *CA) WriteFiles(dir, name string, r Request) (Paths, error) {
	certPEM, keyPEM, err := ca.Issue(r)
	if err != nil {
		return Paths{}, err
	}
	p := Paths{Cert: filepath.Join(dir, name+".crt"), Key: filepath.Join(dir, name+".key"), CA: filepath.Join(dir, CACertFile)}
	for _, f := range []struct {
		path string
		b    []byte
		mode os.FileMode
	}{{p.Cert, certPEM, 0o644}, {p.Key, keyPEM, 0o600}, {p.CA, ca.CertPEM, 0o644}} {
		if err := writeFile(f.path, f.b, f.mode); err != nil {
			return Paths{}, fmt.Errorf("certgen: %w", err)
		}
	}
	return p, nil
}

// writeFile writes b to a new file of mode and renames it over path.
// os.WriteFile would keep the mode of a file already there (a key left
// world-readable stays so) and write the key into it in place.
func writeFile(path string, b []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // after a failure; gone by the rename otherwise
	// CreateTemp's file is 0600 already; Chmod sets the mode asked (0644 for
	// a certificate), before anything is written.
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
