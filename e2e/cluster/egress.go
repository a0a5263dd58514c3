package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ofsdn/ofsdn/internal/proc"
)

// EgressRange is the lab's range for egress IPs: offsets 40-47 of the underlay (between the nodes'
// addresses and the external host's), which every lab node may hold when SetEgressCIDRs is given it.
func (c *Cluster) EgressRange() netip.Prefix {
	b := c.Lab.Underlay.Masked().Addr().As4()
	b[3] += 40
	return netip.PrefixFrom(netip.AddrFrom4(b), 29)
}

// EgressIP is the i-th address of EgressRange (0-7).
func (c *Cluster) EgressIP(i int) netip.Addr {
	a := c.EgressRange().Addr()
	for range i {
		a = a.Next()
	}
	return a
}

// SetEgressCIDRs sets a node's HostSubnet.egressCIDRs (nil: none).
func (c *Cluster) SetEgressCIDRs(ctx context.Context, node string, cidrs ...netip.Prefix) error {
	list := make([]string, 0, len(cidrs))
	for _, p := range cidrs {
		list = append(list, p.String())
	}
	return c.patchNet(ctx, "hostsubnets", node, map[string]any{"egressCIDRs": list})
}

// SetEgressIPs sets a NetNamespace's egressIPs (nil: none).
func (c *Cluster) SetEgressIPs(ctx context.Context, namespace string, ips ...netip.Addr) error {
	list := make([]string, 0, len(ips))
	for _, a := range ips {
		list = append(list, a.String())
	}
	return c.patchNet(ctx, "netnamespaces", namespace, map[string]any{"egressIPs": list})
}

func (c *Cluster) patchNet(ctx context.Context, resource, name string, fields map[string]any) error {
	for k, v := range fields {
		if l, ok := v.([]string); ok && len(l) == 0 {
			fields[k] = nil
		}
	}
	patch, err := json.Marshal(fields)
	if err != nil {
		return err
	}
	var perr error
	switch resource {
	case "hostsubnets":
		_, perr = c.Net.NetworkV1().HostSubnets().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	case "netnamespaces":
		_, perr = c.Net.NetworkV1().NetNamespaces().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	}
	if perr != nil {
		return fmt.Errorf("patch %s/%s %s: %w", resource, name, patch, perr)
	}
	return nil
}

// EgressHolder returns the node the NetNamespace's status names as the holder of ip ("" none).
func (c *Cluster) EgressHolder(ctx context.Context, namespace string, ip netip.Addr) (string, error) {
	nn, err := c.Net.NetworkV1().NetNamespaces().Get(ctx, namespace, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	for _, e := range nn.Status.EgressIPs {
		if e.IP == networkv1.EgressIP(ip.String()) {
			return e.Node, nil
		}
	}
	return "", nil
}

// WaitEgressHolder waits until the status names a holder of ip (other than not, when given) and
// returns it.
func (c *Cluster) WaitEgressHolder(ctx context.Context, namespace string, ip netip.Addr, not string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var holder string
	err := proc.Until(ctx, 0, func() bool {
		h, err := c.EgressHolder(ctx, namespace, ip)
		holder = h
		return err == nil && h != "" && h != not
	})
	if err != nil {
		return holder, fmt.Errorf("egress IP %s of %s: no holder recorded (last %q): %w", ip, namespace, holder, err)
	}
	return holder, nil
}
