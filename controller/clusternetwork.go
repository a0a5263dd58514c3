package controller

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ValidateSpec checks a ClusterNetwork spec on its own: CIDRs, host subnet length, the service network.
// (The CRD's CEL rules check the same; the controller checks again because it must never allocate from
// a spec it cannot use.)
func ValidateSpec(spec networkv1.ClusterNetworkSpec) error {
	var errs []error
	var cidrs []netip.Prefix
	if len(spec.ClusterCIDRs) == 0 {
		errs = append(errs, errors.New("no cluster CIDRs"))
	}
	for _, s := range spec.ClusterCIDRs {
		p, err := netip.ParsePrefix(string(s))
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("cluster CIDR %q: %v", s, err))
			continue
		case !p.Addr().Is4() || p != p.Masked():
			errs = append(errs, fmt.Errorf("cluster CIDR %q is not a canonical IPv4 CIDR", s))
			continue
		case p.Bits()+int(spec.HostSubnetLength) > 32:
			errs = append(errs, fmt.Errorf("hostSubnetLength %d does not fit cluster CIDR %s", spec.HostSubnetLength, p))
		}
		for _, q := range cidrs {
			if q.Overlaps(p) {
				errs = append(errs, fmt.Errorf("cluster CIDRs %s and %s overlap", q, p))
			}
		}
		cidrs = append(cidrs, p)
	}
	if spec.HostSubnetLength < 2 || spec.HostSubnetLength > 30 {
		errs = append(errs, fmt.Errorf("hostSubnetLength %d out of range 2-30", spec.HostSubnetLength))
	}
	svc, err := netip.ParsePrefix(string(spec.ServiceNetwork))
	if err != nil || !svc.Addr().Is4() {
		errs = append(errs, fmt.Errorf("serviceNetwork %q is not an IPv4 CIDR", spec.ServiceNetwork))
	} else {
		for _, p := range cidrs {
			if p.Overlaps(svc) {
				errs = append(errs, fmt.Errorf("serviceNetwork %s overlaps cluster CIDR %s", svc, p))
			}
		}
	}
	switch spec.PluginMode {
	case networkv1.PluginModeSubnet, networkv1.PluginModeMultitenant, networkv1.PluginModeNetworkPolicy:
	default:
		errs = append(errs, fmt.Errorf("pluginMode %q: want subnet, multitenant or networkpolicy", spec.PluginMode))
	}
	switch spec.Encapsulation {
	case "", networkv1.EncapsulationVXLAN, networkv1.EncapsulationNone: // "": an object from before the field (vxlan)
	default:
		errs = append(errs, fmt.Errorf("encapsulation %q: want vxlan or none", spec.Encapsulation))
	}
	return errors.Join(errs...)
}

// orphans lists the allocated subnets a spec would no longer hold.
func orphans(spec networkv1.ClusterNetworkSpec, allocated map[string]netip.Prefix) []string {
	a, err := allocatorFor(spec)
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for node, p := range allocated {
		if !a.Contains(p) {
			out = append(out, fmt.Sprintf("%s (node %s)", p, node))
		}
	}
	return out
}

// ensureClusterNetwork creates ClusterNetwork `default` from the configuration when absent and accepts its
// spec (or, when the stored spec is unusable, the configuration's).
func (c *Controller) ensureClusterNetwork(ctx context.Context) error {
	if err := ValidateSpec(c.cfg.Network); err != nil {
		return fmt.Errorf("controller: configured cluster network: %w", err)
	}
	cn, err := c.net.NetworkV1().ClusterNetworks().Get(ctx, networkv1.ClusterNetworkName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		cn = &networkv1.ClusterNetwork{ObjectMeta: metav1.ObjectMeta{Name: networkv1.ClusterNetworkName}, Spec: c.cfg.Network}
		if cn, err = c.net.NetworkV1().ClusterNetworks().Create(ctx, cn, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("controller: create ClusterNetwork: %w", err)
		}
		c.log.Info("created ClusterNetwork", "spec", c.cfg.Network)
		if err == nil {
			c.accepted = cn.Spec
			return nil
		}
		cn, err = c.net.NetworkV1().ClusterNetworks().Get(ctx, networkv1.ClusterNetworkName, metav1.GetOptions{})
	}
	if err != nil {
		return fmt.Errorf("controller: get ClusterNetwork: %w", err)
	}
	if verr := ValidateSpec(cn.Spec); verr != nil {
		c.log.Error(verr, "stored ClusterNetwork is invalid; allocating from the configuration until it is fixed")
		c.accepted = c.cfg.Network
		return nil
	}
	c.accepted = cn.Spec
	return nil
}

// syncStatus re-validates ClusterNetwork `default` (an admin may have edited it), switches the allocator
// to an accepted new spec, and writes the status: conditions Valid and SubnetsAvailable and the counts.
func (c *Controller) syncStatus(ctx context.Context, _ string) error {
	cn, err := c.networks.Get(networkv1.ClusterNetworkName)
	if apierrors.IsNotFound(err) {
		// Deleted: put it back as last accepted, so agents keep their configuration.
		c.mu.Lock()
		spec := c.accepted
		c.mu.Unlock()
		_, err := c.net.NetworkV1().ClusterNetworks().Create(ctx, &networkv1.ClusterNetwork{
			ObjectMeta: metav1.ObjectMeta{Name: networkv1.ClusterNetworkName}, Spec: spec}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		return nil
	}
	if err != nil {
		return err
	}
	valid := metav1.Condition{Type: networkv1.ConditionValid, Status: metav1.ConditionTrue, Reason: "Accepted",
		Message: "allocating from this spec", ObservedGeneration: cn.Generation}
	c.mu.Lock()
	if verr := ValidateSpec(cn.Spec); verr != nil {
		valid.Status, valid.Reason, valid.Message = metav1.ConditionFalse, "InvalidSpec", verr.Error()+"; keeping the last accepted spec"
	} else if lost := orphans(cn.Spec, c.nodeSubnet); len(lost) > 0 {
		valid.Status, valid.Reason = metav1.ConditionFalse, "OrphansSubnets"
		valid.Message = fmt.Sprintf("the spec would orphan allocated subnets %v; keeping the last accepted spec", lost)
	} else if !reflect.DeepEqual(cn.Spec.ClusterCIDRs, c.accepted.ClusterCIDRs) || cn.Spec.HostSubnetLength != c.accepted.HostSubnetLength {
		a, _ := allocatorFor(cn.Spec)
		for _, p := range c.nodeSubnet {
			_ = a.MarkAllocated(p)
		}
		c.subnetA = a
		c.log.Info("accepted a new cluster network", "cidrs", cn.Spec.ClusterCIDRs, "hostSubnetLength", cn.Spec.HostSubnetLength)
		for n := range c.waiting {
			c.nodeQ.Add(n)
		}
	}
	if valid.Status == metav1.ConditionTrue {
		c.accepted = cn.Spec
	}
	avail := metav1.Condition{Type: networkv1.ConditionSubnetsAvailable, Status: metav1.ConditionTrue, Reason: "Available",
		Message: "every node has a subnet", ObservedGeneration: cn.Generation}
	if n := len(c.waiting); n > 0 {
		avail.Status, avail.Reason = metav1.ConditionFalse, "Exhausted"
		avail.Message = fmt.Sprintf("%d node(s) wait for a subnet: the cluster CIDRs are full", n)
	}
	used, total := c.subnetA.Used(), c.subnetA.Total()
	c.mu.Unlock()

	upd := cn.DeepCopy()
	if valid.Status == metav1.ConditionFalse && !meta.IsStatusConditionFalse(cn.Status.Conditions, networkv1.ConditionValid) {
		c.recorder.Eventf(cn, corev1.EventTypeWarning, valid.Reason, "%s", valid.Message)
		c.log.Error(errors.New(valid.Message), "ClusterNetwork change refused", "reason", valid.Reason)
	}
	meta.SetStatusCondition(&upd.Status.Conditions, valid)
	meta.SetStatusCondition(&upd.Status.Conditions, avail)
	upd.Status.ObservedGeneration, upd.Status.AllocatedSubnets, upd.Status.TotalSubnets = cn.Generation, used, total
	if reflect.DeepEqual(upd.Status, cn.Status) {
		return nil
	}
	if _, err := c.net.NetworkV1().ClusterNetworks().UpdateStatus(ctx, upd, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update ClusterNetwork status: %w", err)
	}
	return nil
}
