package cluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// NodeAPINamespace holds the ServiceAccounts NodeAPIToken makes.
const NodeAPINamespace = "e2e-node-api"

// NodeAPIToken returns a token of ServiceAccount NodeAPINamespace/name bound to clusterRoles (say
// ofsdn-metrics-reader, to scrape the agents' /metrics as Prometheus does, or ofsdn-node-reader for their
// debug API), for calling agents directly with Authorization: Bearer. The agents answer only such
// callers (agent/nodeauth).
func (c *Cluster) NodeAPIToken(ctx context.Context, name string, clusterRoles ...string) (string, error) {
	cfg, err := c.API.ServiceAccountToken(ctx, NodeAPINamespace, name)
	if err != nil {
		return "", err
	}
	for _, role := range clusterRoles {
		b := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "e2e-" + name + "-" + role},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: NodeAPINamespace, Name: name}}}
		if _, err := c.Client.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return "", fmt.Errorf("cluster: bind %s to %s: %w", name, role, err)
		}
	}
	return cfg.BearerToken, nil
}

// AgentHTTPClient calls the agents' TLS servers (metrics and health, debug API). Like kubelet's probes
// and Prometheus's node scrapes it does not verify the agents' self-signed certificates: the token is
// what the agents check.
func AgentHTTPClient(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
}

// WriteKubeconfig writes a kubeconfig for cfg's server and credentials (a token or a client
// certificate), e.g. for running flowctl as some user.
func WriteKubeconfig(path string, cfg *rest.Config) error { return writeKubeconfig(path, cfg) }
