// Package kubeconfig gives ofsdn's components (agent, controller) their API server configuration.
package kubeconfig

import (
	"errors"
	"fmt"
	"os"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// ErrNoAPIServerAddress says an in-cluster component was not told the API server's real address.
var ErrNoAPIServerAddress = errors.New("KUBERNETES_SERVICE_HOST is empty: ofsdn replaces kube-proxy, so its agent " +
	"and controller reach the API server at its real address, never the kubernetes ClusterIP (which works only " +
	"once the agent runs); set data.host (and data.port) in ConfigMap ofsdn/ofsdn-apiserver (deploy/apiserver.yaml)")

// Load reads the kubeconfig at path, or with an empty path the in-cluster configuration, which must name
// the API server's real address (deploy/apiserver.yaml sets KUBERNETES_SERVICE_HOST and _PORT from it).
func Load(path string) (*rest.Config, error) {
	if path != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
		}
		return cfg, nil
	}
	if os.Getenv("KUBERNETES_SERVICE_HOST") == "" {
		return nil, ErrNoAPIServerAddress
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("in-cluster configuration: %w", err)
	}
	return cfg, nil
}
