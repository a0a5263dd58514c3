package kubeconfig

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	if err := os.WriteFile(good, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://192.0.2.10:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("{not yaml"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path, serviceHost string
		wantHost                string
		wantErr                 error
		wantErrText             string
	}{
		{name: "kubeconfig file", path: good, wantHost: "https://192.0.2.10:6443"},
		{name: "malformed kubeconfig", path: bad, wantErrText: "kubeconfig " + bad},
		{name: "missing kubeconfig", path: filepath.Join(dir, "absent"), wantErrText: "absent"},
		{name: "in cluster without the real address", wantErr: ErrNoAPIServerAddress},
		// With the address but outside a pod (no service account token) client-go's own error comes back.
		{name: "in cluster without a token", serviceHost: "192.0.2.10", wantErrText: "in-cluster configuration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("KUBERNETES_SERVICE_HOST", tc.serviceHost)
			t.Setenv("KUBERNETES_SERVICE_PORT", "6443")
			cfg, err := Load(tc.path)
			switch {
			case tc.wantErr != nil:
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
			case tc.wantErrText != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErrText) {
					t.Fatalf("err = %v, want one mentioning %q", err, tc.wantErrText)
				}
			default:
				if err != nil {
					t.Fatal(err)
				}
				if cfg.Host != tc.wantHost {
					t.Fatalf("host = %q, want %q", cfg.Host, tc.wantHost)
				}
			}
		})
	}
}
