package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ofsdn/ofsdn/e2e/nodesim"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ofsdn/ofsdn/internal/proc"
)

// TestPort is the port every lab pod serves on, over TCP and UDP.
const TestPort = 8080

// Pod is a running lab pod.
type Pod struct {
	Namespace, Name, Node string
	IP                    netip.Addr
	NetNS                 string // its network namespace (the node's, for hostNetwork pods)
	c                     *Cluster
}

// Key is namespace/name.
func (p *Pod) Key() string { return p.Namespace + "/" + p.Name }

// EnsureNamespace creates a namespace and waits for what pods in it need: its ServiceAccount and its
// NetNamespace (the controller's VNID).
func (c *Cluster) EnsureNamespace(ctx context.Context, name string) error {
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", name, err)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err := proc.Until(ctx, 0, func() bool {
		_, err1 := c.Client.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		_, err2 := c.Net.NetworkV1().NetNamespaces().Get(ctx, name, metav1.GetOptions{})
		return err1 == nil && err2 == nil
	})
	if err != nil {
		return fmt.Errorf("namespace %s: no ServiceAccount or NetNamespace yet: %w", name, err)
	}
	return nil
}

// PodSpec builds a lab pod bound to node that serves TestPort over TCP and UDP. It keeps the default
// grace period: a grace period of 0 makes the API server drop a deleted pod at once, before the node has
// run CNI DEL; with one, the pod leaves only once its node simulator finished it, as with kubelet.
func PodSpec(namespace, name, node string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{NodeName: node,
			Containers: []corev1.Container{{Name: "testpod", Image: "ofsdn-testpod", Ports: []corev1.ContainerPort{
				{Name: "tcp", ContainerPort: TestPort, Protocol: corev1.ProtocolTCP},
				{Name: "udp", ContainerPort: TestPort, Protocol: corev1.ProtocolUDP}}}}}}
}

// RunPod creates a pod from spec and waits until it runs with an address and serves.
func (c *Cluster) RunPod(ctx context.Context, spec *corev1.Pod) (*Pod, error) {
	if c.opts.Kubelets {
		spec = kubeletPodSpec(spec)
	}
	if _, err := c.Client.CoreV1().Pods(spec.Namespace).Create(ctx, spec, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create pod %s/%s: %w", spec.Namespace, spec.Name, err)
	}
	return c.WaitPod(ctx, spec.Namespace, spec.Name)
}

// WaitPod waits until a pod runs with an address and serves TestPort.
func (c *Cluster) WaitPod(ctx context.Context, namespace, name string) (*Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	var pod *corev1.Pod
	var last error
	err := proc.Until(ctx, 0, func() bool {
		p, err := c.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			last = err
			return false
		}
		pod = p
		return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != ""
	})
	if err != nil {
		why := fmt.Sprint(last)
		if pod != nil {
			why = fmt.Sprintf("phase %s, conditions %v", pod.Status.Phase, pod.Status.Conditions)
		}
		return nil, fmt.Errorf("pod %s/%s not running: %s: %w", namespace, name, why, err)
	}
	ip, err := netip.ParseAddr(pod.Status.PodIP)
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: podIP %q: %w", namespace, name, pod.Status.PodIP, err)
	}
	n := c.Node(pod.Spec.NodeName)
	if n == nil {
		return nil, fmt.Errorf("pod %s/%s runs on %q, not a lab node", namespace, name, pod.Spec.NodeName)
	}
	p := &Pod{Namespace: namespace, Name: name, Node: n.Name, IP: ip, c: c,
		NetNS: nodesim.NetNSName(c.Lab.Prefix+"-"+n.Name, namespace, name)}
	if pod.Spec.HostNetwork {
		p.NetNS = n.NetNS
	} else if n.Kube != nil {
		if err := c.attachPodNetNS(ctx, n, pod, p.NetNS); err != nil {
			return nil, err
		}
	}
	// The process starts after the status is written: wait until it answers locally.
	err = proc.Until(ctx, 0, func() bool {
		r, err := p.Probe(ctx, "tcp", netip.AddrPortFrom(ip, TestPort), 0)
		return err == nil && strings.HasPrefix(r, p.Key()+" ")
	})
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s does not serve on %s:%d: %w", namespace, name, ip, TestPort, err)
	}
	return p, nil
}

// DeletePod deletes a pod and waits until its node finished it.
func (c *Cluster) DeletePod(ctx context.Context, namespace, name string) error {
	if err := c.Client.CoreV1().Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err := proc.Until(ctx, 0, func() bool {
		_, err := c.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	if c.opts.Kubelets {
		// The name attachPodNetNS gave the pod's namespace holds it: let it go with the pod.
		for _, n := range c.Nodes {
			_ = exec.CommandContext(context.WithoutCancel(ctx), "ip", "netns", "del", nodesim.NetNSName(c.Lab.Prefix+"-"+n.Name, namespace, name)).Run()
		}
	}
	return err
}

// Probe connects from the pod to dst with ofsdn-testpod (tcp or udp, optionally echoing payload bytes)
// and returns the reply "<server pod> <client address as the server saw it>".
func (p *Pod) Probe(ctx context.Context, proto string, dst netip.AddrPort, payload int) (string, error) {
	return p.c.probe(ctx, p.NetNS, proto, dst, payload)
}

// Ping sends one ICMP echo from the pod; it reports whether a reply came within a second.
func (p *Pod) Ping(ctx context.Context, dst netip.Addr) bool {
	return exec.CommandContext(ctx, "ip", "netns", "exec", p.NetNS, "ping", "-n", "-q", "-c", "1", "-W", "1", dst.String()).Run() == nil
}

// ProbeFrom probes from any lab namespace (a node's, the external host's).
func (c *Cluster) ProbeFrom(ctx context.Context, netns, proto string, dst netip.AddrPort) (string, error) {
	return c.probe(ctx, netns, proto, dst, 0)
}

func (c *Cluster) probe(ctx context.Context, netns, proto string, dst netip.AddrPort, payload int) (string, error) {
	args := []string{"netns", "exec", netns, filepath.Join(c.BinDir, "ofsdn-testpod"), "probe", proto, dst.String(), "--timeout", "1s"}
	if payload > 0 {
		args = append(args, "--payload", strconv.Itoa(payload))
	}
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("probe %s %s from %s: %w: %s", proto, dst, netns, err, strings.TrimSpace(string(out)))
	}
	return strings.TrimSpace(string(out)), nil
}
