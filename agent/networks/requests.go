package networks

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	nadutils "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/utils"
	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
)

// Request is one network a pod asks for (one element of its k8s.v1.cni.cncf.io/networks annotation)
// that is ofsdn's, resolved to its Network.
type Request struct {
	// Interface in the pod: the annotation's, else net<N> for the Nth element (as Multus names them).
	Interface string
	// NAD is the NetworkAttachmentDefinition, namespace/name: the network-status entry's name.
	NAD     string
	Network string
	// IP and MAC are the annotation's static address and MAC (invalid / nil: allocated, derived).
	IP  netip.Addr
	MAC net.HardwareAddr
}

// NADs finds NetworkAttachmentDefinitions; a missing one is an error wrapping ErrNoNAD.
type NADs interface {
	NAD(namespace, name string) (*nadv1.NetworkAttachmentDefinition, error)
}

// ErrNoNAD says a NetworkAttachmentDefinition the pod names does not exist.
var ErrNoNAD = errors.New("no such NetworkAttachmentDefinition")

// ErrBadRequest says what a pod asks for cannot be done as asked (a malformed annotation, an interface
// name twice, a static address outside the network, a NAD that names no network).
var ErrBadRequest = errors.New("bad network request")

// maxInterfaces bounds the attachments of one pod (a request for hundreds is a mistake, not a design).
const maxInterfaces = 32

// Requests resolves a pod's networks annotation ("" asks for nothing): the ofsdn attachments it asks
// for, in order, and the names of the NADs it names that are not ofsdn's (another CNI's, left to a
// meta-plugin such as Multus). Every element is checked before any is returned: the pod gets all of
// them or an error that names the first problem.
func Requests(annotation, podNamespace string, nads NADs) (reqs []Request, foreign []string, err error) {
	if strings.TrimSpace(annotation) == "" {
		return nil, nil, nil
	}
	elems, err := nadutils.ParseNetworkAnnotation(annotation, podNamespace)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: annotation %s: %v", ErrBadRequest, nadv1.NetworkAttachmentAnnot, err)
	}
	if len(elems) > maxInterfaces {
		return nil, nil, fmt.Errorf("%w: annotation %s asks for %d networks; ofsdn attaches at most %d", ErrBadRequest, nadv1.NetworkAttachmentAnnot, len(elems), maxInterfaces)
	}
	seen := map[string]int{}
	for i, e := range elems {
		nad := e.Namespace + "/" + e.Name
		iface := e.InterfaceRequest
		if iface == "" {
			iface = fmt.Sprintf("net%d", i+1)
		}
		if err := validInterface(iface); err != nil {
			return nil, nil, fmt.Errorf("%w: %s (element %d, %s): %v", ErrBadRequest, nadv1.NetworkAttachmentAnnot, i+1, nad, err)
		}
		if j, dup := seen[iface]; dup {
			return nil, nil, fmt.Errorf("%w: %s asks for interface %s twice (elements %d and %d)", ErrBadRequest, nadv1.NetworkAttachmentAnnot, iface, j+1, i+1)
		}
		seen[iface] = i
		def, err := nads.NAD(e.Namespace, e.Name)
		if err != nil {
			return nil, nil, fmt.Errorf("%s (element %d): %w", nadv1.NetworkAttachmentAnnot, i+1, err)
		}
		network, ours, err := NetworkOfConfig([]byte(def.Spec.Config))
		if err != nil {
			return nil, nil, fmt.Errorf("%w: NetworkAttachmentDefinition %s: %v", ErrBadRequest, nad, err)
		}
		if !ours {
			foreign = append(foreign, nad)
			continue
		}
		r := Request{Interface: iface, NAD: nad, Network: network}
		if r.IP, err = staticIP(e.IPRequest); err != nil {
			return nil, nil, fmt.Errorf("%w: %s (element %d, %s): %v", ErrBadRequest, nadv1.NetworkAttachmentAnnot, i+1, nad, err)
		}
		if e.MacRequest != "" {
			if r.MAC, err = StaticMAC(e.MacRequest); err != nil {
				return nil, nil, fmt.Errorf("%w: %s (element %d, %s): %v", ErrBadRequest, nadv1.NetworkAttachmentAnnot, i+1, nad, err)
			}
		}
		reqs = append(reqs, r)
	}
	return reqs, foreign, nil
}

// validInterface checks a pod interface name a request gives: a Linux interface name, not the cluster
// network's eth0.
func validInterface(name string) error {
	switch {
	case name == "eth0" || name == "lo":
		return fmt.Errorf("interface %q is the pod's own", name)
	case len(name) > 15:
		return fmt.Errorf("interface %q is longer than 15 characters", name)
	case strings.ContainsAny(name, "/: \t\n") || name == "." || name == "..":
		return fmt.Errorf("interface %q is no valid interface name", name)
	}
	return nil
}

// staticIP reads the annotation's "ips": at most one IPv4 address, with or without a prefix length.
func staticIP(ips []string) (netip.Addr, error) {
	switch len(ips) {
	case 0:
		return netip.Addr{}, nil
	case 1:
	default:
		return netip.Addr{}, fmt.Errorf("ips %v: ofsdn networks are IPv4, one address per interface", ips)
	}
	s := ips[0]
	if p, err := netip.ParsePrefix(s); err == nil {
		s = p.Addr().String()
	}
	ip, err := netip.ParseAddr(s)
	if err != nil || !ip.Is4() {
		return netip.Addr{}, fmt.Errorf("ips %q: not an IPv4 address", ips[0])
	}
	return ip, nil
}

// StaticAddress reads a static address and MAC as a runtime passes them (runtimeConfig ips and mac):
// either may be absent.
func StaticAddress(ips []string, mac string) (netip.Addr, net.HardwareAddr, error) {
	ip, err := staticIP(ips)
	if err != nil {
		return netip.Addr{}, nil, err
	}
	if mac == "" {
		return ip, nil, nil
	}
	hw, err := StaticMAC(mac)
	return ip, hw, err
}

// StaticMAC reads a requested MAC: a unicast Ethernet address that is no network gateway's (0a:59:...).
func StaticMAC(s string) (net.HardwareAddr, error) {
	mac, err := net.ParseMAC(s)
	switch {
	case err != nil || len(mac) != 6:
		return nil, fmt.Errorf("mac %q: not an Ethernet address", s)
	case mac[0]&1 == 1:
		return nil, fmt.Errorf("mac %q is a multicast address", s)
	case mac.String() == "00:00:00:00:00:00":
		return nil, fmt.Errorf("mac %q is all zeros", s)
	case mac[0] == 0x0a && mac[1] == 0x59:
		return nil, fmt.Errorf("mac %q: 0a:59:... are the networks' gateways'", s)
	}
	return mac, nil
}

// NetworkOfConfig reads a NetworkAttachmentDefinition's CNI config (a plugin configuration or a
// conflist): the Network its ofsdn plugin names, and whether it has one at all (a config of another
// plugin type is not ofsdn's: ours is false and no error).
func NetworkOfConfig(config []byte) (network string, ours bool, err error) {
	if strings.TrimSpace(string(config)) == "" {
		return "", false, errors.New("spec.config is empty")
	}
	var conf struct {
		Type    string            `json:"type"`
		Network string            `json:"network"`
		Plugins []json.RawMessage `json:"plugins"`
	}
	if err := json.Unmarshal(config, &conf); err != nil {
		return "", false, fmt.Errorf("spec.config is no CNI configuration: %v", err)
	}
	if conf.Type == "" && len(conf.Plugins) > 0 {
		for _, p := range conf.Plugins {
			if network, ours, err := NetworkOfConfig(p); ours || err != nil {
				return network, ours, err
			}
		}
		return "", false, nil
	}
	if conf.Type != "ofsdn" {
		return "", false, nil
	}
	if conf.Network == "" {
		return "", true, fmt.Errorf("its ofsdn configuration names no Network (add \"%s\": \"<Network name>\")", networkv1.NADNetworkKey)
	}
	return conf.Network, true, nil
}
