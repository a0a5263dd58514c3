package conformance

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ofsdn/ofsdn/e2e/cluster"
	"github.com/ofsdn/ofsdn/e2e/labimages"
	"github.com/ofsdn/ofsdn/internal/proc"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// corefile serves the cluster domain and reverse zones from the API. There is no forward: the lab has
// no upstream resolver (its nodes have no route out), so names outside the cluster do not resolve.
const corefile = `.:53 {
    errors
    health {
        lameduck 5s
    }
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
    prometheus :9153
    cache 30
    reload
    loadbalance
}
`

// dnsManifest is the lab's cluster DNS as kubeadm deploys it: CoreDNS in kube-system behind the
// Service kube-dns at the address kubelets give pods, with kubeadm's RBAC and labels (the e2e DNS tests
// find it by k8s-app=kube-dns).
func dnsManifest(image, clusterIP string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
  - apiGroups: [""]
    resources: [endpoints, services, pods, namespaces]
    verbs: [list, watch]
  - apiGroups: [discovery.k8s.io]
    resources: [endpointslices]
    verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects: [{kind: ServiceAccount, name: coredns, namespace: kube-system}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
%s---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels: {k8s-app: kube-dns}
spec:
  replicas: 2
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      dnsPolicy: Default
      affinity:
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 100
              podAffinityTerm:
                topologyKey: kubernetes.io/hostname
                labelSelector: {matchLabels: {k8s-app: kube-dns}}
      containers:
        - name: coredns
          image: %s
          imagePullPolicy: Never
          args: ["-conf", "/etc/coredns/Corefile"]
          ports:
            - {name: dns, containerPort: 53, protocol: UDP}
            - {name: dns-tcp, containerPort: 53, protocol: TCP}
            - {name: metrics, containerPort: 9153, protocol: TCP}
          securityContext:
            allowPrivilegeEscalation: false
            capabilities: {add: [NET_BIND_SERVICE], drop: [ALL]}
            readOnlyRootFilesystem: true
          livenessProbe:
            httpGet: {path: /health, port: 8080}
          readinessProbe:
            httpGet: {path: /ready, port: 8181}
          volumeMounts: [{name: config, mountPath: /etc/coredns, readOnly: true}]
      volumes:
        - name: config
          configMap: {name: coredns, items: [{key: Corefile, path: Corefile}]}
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns, kubernetes.io/name: CoreDNS}
spec:
  selector: {k8s-app: kube-dns}
  clusterIP: %s
  ports:
    - {name: dns, port: 53, protocol: UDP}
    - {name: dns-tcp, port: 53, protocol: TCP}
    - {name: metrics, port: 9153, protocol: TCP}
`, indent(corefile, "    "), image, clusterIP)
}

func indent(s, prefix string) string {
	return prefix + strings.ReplaceAll(strings.TrimSuffix(s, "\n"), "\n", "\n"+prefix) + "\n"
}

// DeployDNS runs CoreDNS in the cluster (its image must be among the nodes' images) and waits until
// both replicas are ready.
func DeployDNS(ctx context.Context, c *cluster.Cluster) error {
	path := filepath.Join(c.Dir, "coredns.yaml")
	if err := os.WriteFile(path, []byte(dnsManifest(labimages.CoreDNS, c.ClusterDNSIP())), 0o644); err != nil {
		return fmt.Errorf("conformance: %w", err)
	}
	if out, err := c.API.Kubectl("apply", "--server-side", "-f", path); err != nil {
		return fmt.Errorf("conformance: deploy CoreDNS: %w\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	var ready int32
	err := proc.Until(ctx, 0, func() bool {
		d, err := c.Client.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
		if err == nil {
			ready = d.Status.ReadyReplicas
		}
		return err == nil && ready == 2
	})
	if err != nil {
		return fmt.Errorf("conformance: CoreDNS not ready (%d of 2 replicas): %w", ready, err)
	}
	return nil
}
