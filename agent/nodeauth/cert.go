package nodeauth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// The serving certificate. As kubelet without a cluster-signed one, the agent makes its own: self-signed,
// kept in the node's state directory (<state-dir>/pki/ofsdn-agent.{crt,key}, the key 0600) so a
// restarted agent presents the same one, remade when it is missing, unreadable, not for this node or
// within RenewBefore of its end (also while serving). Nobody on the usual paths can verify it, and
// nobody needs to: the API server's node proxy skips verification of every node port but kubelet's
// (measured; see the package comment), and Prometheus scrapes nodes with insecure_skip_verify, as it
// does kubelet. What protects the node API is the token check, not the server's identity; a client that
// wants to verify pins this certificate, or the operator gives the agent one of its own CA
// (--tls-cert-file, --tls-private-key-file).
const (
	CertValidity = 365 * 24 * time.Hour
	RenewBefore  = 30 * 24 * time.Hour
	certFile     = "ofsdn-agent.crt"
	keyFile      = "ofsdn-agent.key"
)

// ServingCert is the certificate the agent's TLS servers present.
type ServingCert struct {
	dir   string // "" for an operator's files, which are never remade
	node  string
	ips   []net.IP
	clock func() time.Time

	mu   sync.Mutex
	cert *tls.Certificate
}

// SelfSignedCert loads the agent's certificate from dir, or makes one for node (DNS name) and ips.
func SelfSignedCert(dir, node string, ips []net.IP) (*ServingCert, error) {
	s := &ServingCert{dir: dir, node: node, ips: ips, clock: time.Now}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	if c, err := s.load(); err == nil && s.fits(c.Leaf) {
		s.cert = c
		return s, nil
	}
	if err := s.renew(); err != nil {
		return nil, err
	}
	return s, nil
}

// CertFiles serves an operator's certificate and key (PEM), e.g. signed by the cluster's CA.
func CertFiles(certPath, keyPath string) (*ServingCert, error) {
	c, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		return nil, fmt.Errorf("serving certificate %s: %w", certPath, err)
	}
	return &ServingCert{cert: &c, clock: time.Now}, nil
}

// TLSConfig serves the certificate, TLS 1.2 at least.
func (s *ServingCert) TLSConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: s.get}
}

// Leaf is the certificate served now.
func (s *ServingCert) Leaf() *x509.Certificate {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cert.Leaf
}

func (s *ServingCert) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dir != "" && !s.clock().Before(s.cert.Leaf.NotAfter.Add(-RenewBefore)) {
		if err := s.renewLocked(); err != nil {
			return nil, err
		}
	}
	return s.cert, nil
}

func (s *ServingCert) load() (*tls.Certificate, error) {
	c, err := tls.LoadX509KeyPair(filepath.Join(s.dir, certFile), filepath.Join(s.dir, keyFile))
	if err != nil {
		return nil, err
	}
	return &c, nil
}

// fits says whether a certificate is this node's and far enough from its end.
func (s *ServingCert) fits(c *x509.Certificate) bool {
	if c == nil || !s.clock().Before(c.NotAfter.Add(-RenewBefore)) || !slices.Contains(c.DNSNames, s.node) {
		return false
	}
	for _, ip := range s.ips {
		if !slices.ContainsFunc(c.IPAddresses, ip.Equal) {
			return false
		}
	}
	return true
}

func (s *ServingCert) renew() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.renewLocked()
}

func (s *ServingCert) renewLocked() error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("serving certificate: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return fmt.Errorf("serving certificate: %w", err)
	}
	now := s.clock()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: fmt.Sprintf("ofsdn-agent@%s@%d", s.node, now.Unix())},
		NotBefore:             now.Add(-time.Hour), // clocks drift
		NotAfter:              now.Add(CertValidity),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		DNSNames:              []string{s.node},
		IPAddresses:           s.ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return fmt.Errorf("serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("serving certificate: %w", err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	// The key first: a certificate on disk always has its key beside it.
	if err := writeAtomic(filepath.Join(s.dir, keyFile), keyPEM, 0o600); err != nil {
		return err
	}
	if err := writeAtomic(filepath.Join(s.dir, certFile), certPEM, 0o644); err != nil {
		return err
	}
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("serving certificate: %w", err)
	}
	s.cert = &c
	return nil
}

// writeAtomic replaces path with data through a temporary file in the same directory.
func writeAtomic(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("serving certificate: %w", err)
	}
	tmp := f.Name()
	err = f.Chmod(mode)
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	err = errors.Join(err, f.Close())
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("serving certificate: write %s: %w", path, err)
	}
	return nil
}
