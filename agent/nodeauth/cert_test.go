package nodeauth

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestSelfSignedCert: made once and kept in the state directory (the key root's only), presented again
// after a restart, remade for another node or address and before it ends, and usable by a client that
// pins it.
func TestSelfSignedCert(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	ip := net.ParseIP("198.51.100.11")
	s, err := SelfSignedCert(dir, "n1", []net.IP{ip})
	if err != nil {
		t.Fatal(err)
	}
	leaf := s.Leaf()
	if leaf.DNSNames[0] != "n1" || !leaf.IPAddresses[0].Equal(ip) || leaf.NotAfter.Sub(leaf.NotBefore) < CertValidity {
		t.Errorf("certificate: %v %v %v–%v", leaf.DNSNames, leaf.IPAddresses, leaf.NotBefore, leaf.NotAfter)
	}
	for name, want := range map[string]os.FileMode{keyFile: 0o600, certFile: 0o644} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil || st.Mode().Perm() != want {
			t.Errorf("%s: %v %v, want mode %v", name, st.Mode(), err, want)
		}
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("%s: %v", dir, err)
	}

	again, err := SelfSignedCert(dir, "n1", []net.IP{ip})
	if err != nil || !again.Leaf().Equal(leaf) {
		t.Errorf("a restart made a new certificate: %v", err)
	}
	other, err := SelfSignedCert(dir, "n1", []net.IP{net.ParseIP("198.51.100.12")})
	if err != nil || other.Leaf().Equal(leaf) {
		t.Errorf("a new address kept the old certificate: %v", err)
	}

	s = other
	// A client pinning the certificate verifies the server.
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	srv.TLS = s.TLSConfig()
	srv.StartTLS()
	defer srv.Close()
	pool := x509.NewCertPool()
	pool.AddCert(s.Leaf())
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "n1"}}}
	resp, err := client.Get(srv.URL)
	if err != nil {
		t.Fatalf("pinned client: %v", err)
	}
	resp.Body.Close()

	// An operator's files are served as they are.
	files, err := CertFiles(filepath.Join(dir, certFile), filepath.Join(dir, keyFile))
	if err != nil || !files.Leaf().Equal(s.Leaf()) {
		t.Errorf("CertFiles: %v", err)
	}
	if _, err := CertFiles(filepath.Join(dir, "missing.crt"), filepath.Join(dir, keyFile)); err == nil {
		t.Error("CertFiles accepted a missing file")
	}

	// Near its end, the next handshake gets a new one, which a restart then finds.
	old := s.Leaf()
	later := old.NotAfter.Add(-RenewBefore)
	s.clock = func() time.Time { return later }
	c, err := s.get(nil)
	if err != nil || c.Leaf.Equal(old) || !c.Leaf.NotAfter.After(later.Add(RenewBefore)) {
		t.Fatalf("not renewed before its end: %v", err)
	}
	if onDisk, err := CertFiles(filepath.Join(dir, certFile), filepath.Join(dir, keyFile)); err != nil || !onDisk.Leaf().Equal(c.Leaf) {
		t.Errorf("the renewed certificate is not the one on disk: %v", err)
	}
}
