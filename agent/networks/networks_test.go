package networks

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func network(name, cidr string, vni uint32, sel map[string]string, talk ...string) *networkv1.Network {
	return &networkv1.Network{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:   networkv1.NetworkSpec{CIDR: networkv1.CIDR(cidr), HostSubnetLength: 8, NamespaceSelector: metav1.LabelSelector{MatchLabels: sel}},
		Status: networkv1.NetworkStatus{VNI: vni, CrossTalk: talk}}
}

func subnet(net, node, hostIP, cidr string) *networkv1.NetworkSubnet {
	return &networkv1.NetworkSubnet{ObjectMeta: metav1.ObjectMeta{Name: networkv1.NetworkSubnetName(net, node)},
		Network: net, Node: node, HostIP: hostIP, Subnet: networkv1.CIDR(cidr)}
}

func sampleIndex(t *testing.T) *Index {
	t.Helper()
	x := NewIndex()
	for _, n := range []*networkv1.Network{
		network("red", "10.200.0.0/16", 0xfff001, map[string]string{"net": "red"}, "green"),
		network("blue", "10.200.0.0/16", 0xfff002, nil),
		network("green", "10.201.0.0/16", 0xfff003, nil, "red"),
		network("new", "10.202.0.0/16", 0, nil), // no VNI yet
	} {
		if err := x.SetNetwork(n); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []*networkv1.NetworkSubnet{
		subnet("red", "n1", "192.0.2.11", "10.200.1.0/24"), subnet("red", "n2", "192.0.2.12", "10.200.2.0/24"),
		subnet("blue", "n1", "192.0.2.11", "10.200.1.0/24"), subnet("green", "n1", "192.0.2.11", "10.201.1.0/24"),
		subnet("new", "n1", "192.0.2.11", "10.202.1.0/24"),
	} {
		if err := x.SetSubnet(s); err != nil {
			t.Fatal(err)
		}
	}
	x.SetNamespace("a", map[string]string{"net": "red"})
	x.SetNamespace("b", nil)
	return x
}

// TestPlacement: a pod attaches where the Network exists, has a VNI and a subnet on the node, is not
// being deleted, and admits its namespace; every refusal says which of those failed.
func TestPlacement(t *testing.T) {
	x := sampleIndex(t)
	p, err := x.Placement("red", "a", "n1")
	if err != nil {
		t.Fatal(err)
	}
	if p.VNI != 0xfff001 || p.Subnet.String() != "10.200.1.0/24" || p.Gateway.String() != "10.200.1.1" ||
		fmt.Sprint(p.Routes) != "[10.201.0.0/16]" {
		t.Fatalf("placement %+v", p)
	}
	if p, err := x.Placement("blue", "b", "n1"); err != nil || len(p.Routes) != 0 {
		t.Fatalf("blue: %+v %v", p, err)
	}
	deleting := network("blue", "10.200.0.0/16", 0xfff002, nil)
	deleting.DeletionTimestamp = &metav1.Time{}
	for _, tc := range []struct {
		name, network, ns, node string
		edit                    func(x *Index)
		want                    error
		says                    string
	}{
		{"not admitted", "red", "b", "n1", nil, ErrNotAdmitted, `does not admit namespace "b"`},
		{"unknown namespace has no labels", "red", "zz", "n1", nil, ErrNotAdmitted, "namespaceSelector"},
		{"no such network", "purple", "a", "n1", nil, ErrUnavailable, "does not exist"},
		{"no VNI yet", "new", "a", "n1", nil, ErrUnavailable, "no VNI yet"},
		{"no subnet on the node", "red", "a", "n3", nil, ErrUnavailable, "no subnet on node n3"},
		{"being deleted", "blue", "b", "n1", func(x *Index) { _ = x.SetNetwork(deleting) }, ErrUnavailable, "being deleted"},
		{"labels changed", "red", "a", "n1", func(x *Index) { x.SetNamespace("a", map[string]string{"net": "blue"}) }, ErrNotAdmitted, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := sampleIndex(t)
			if tc.edit != nil {
				tc.edit(x)
			}
			_, err := x.Placement(tc.network, tc.ns, tc.node)
			if !errors.Is(err, tc.want) || !strings.Contains(fmt.Sprint(err), tc.says) {
				t.Fatalf("error %v, want %v saying %q", err, tc.want, tc.says)
			}
		})
	}
}

// TestStatesAndCarrying: what the node renders: networks with a VNI, its own subnet apart from the
// others'; attachments only of admitted namespaces, with their network's VNI.
func TestStatesAndCarrying(t *testing.T) {
	x := sampleIndex(t)
	st := x.States("n1")
	var names []string
	for _, s := range st {
		names = append(names, s.Name)
	}
	if fmt.Sprint(names) != "[blue green red]" {
		t.Fatalf("states %v", names)
	}
	red := st[2]
	if red.LocalSubnet.String() != "10.200.1.0/24" || len(red.Remotes) != 1 || red.Remotes[0].Node != "n2" ||
		red.Remotes[0].NodeIP.String() != "192.0.2.12" || fmt.Sprint(red.CrossTalk) != "[green]" {
		t.Fatalf("red %+v", red)
	}
	atts := []Attachment{
		{Namespace: "a", Name: "p", Interface: "net1", Network: "red"},
		{Namespace: "b", Name: "q", Interface: "net1", Network: "red"},  // not admitted
		{Namespace: "b", Name: "q", Interface: "net2", Network: "blue"}, // admitted: empty selector
		{Namespace: "a", Name: "p", Interface: "net2", Network: "new"},  // no VNI
		{Namespace: "a", Name: "p", Interface: "net3", Network: "gone"},
	}
	got := x.Carrying(atts)
	if len(got) != 2 || got[0].Interface != "net1" || got[0].VNI != 0xfff001 || got[1].Network != "blue" || got[1].VNI != 0xfff002 {
		t.Fatalf("carrying %+v", got)
	}
	// Each one left out says why (the debug API shows it beside the attachment).
	for i, want := range []string{"", "Network red does not admit namespace b", "", "Network new has no VNI yet", "Network gone does not exist"} {
		why := x.WhyNotCarrying(atts[i])
		if (want == "") != (why == "") || !strings.HasPrefix(why, want) {
			t.Errorf("%s: why not carrying %q, want %q", atts[i].Interface+"/"+atts[i].Network, why, want)
		}
	}
	x.SetNamespace("a", nil)
	if got := x.Carrying(atts); len(got) != 1 {
		t.Fatalf("after a's labels went: %+v", got)
	}
	x.DeleteSubnet(networkv1.NetworkSubnetName("red", "n2"))
	if st := x.States("n1"); len(st[2].Remotes) != 0 {
		t.Fatalf("n2's subnet deleted: %+v", st[2])
	}
}

func TestSetRefusesCorruptObjects(t *testing.T) {
	x := sampleIndex(t)
	for _, n := range []*networkv1.Network{
		network("red", "10.200.0.0/33", 0xfff001, nil),
		network("red", "10.200.0.1/16", 0xfff001, nil),
		network("red", "fd00::/64", 0xfff001, nil),
		network("red", "10.200.0.0/16", 42, nil),
		func() *networkv1.Network {
			n := network("red", "10.200.0.0/16", 0xfff001, nil)
			n.Spec.NamespaceSelector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "k", Operator: "Bogus"}}
			return n
		}(),
	} {
		if err := x.SetNetwork(n); err == nil {
			t.Errorf("%+v accepted", n.Spec)
		}
		if _, ok := x.Network("red"); ok {
			t.Errorf("a corrupt red is still filed")
		}
		_ = x.SetNetwork(network("red", "10.200.0.0/16", 0xfff001, nil))
	}
	for _, s := range []*networkv1.NetworkSubnet{subnet("red", "n1", "x", "10.200.1.0/24"), subnet("red", "n1", "192.0.2.11", "10.200.1.0/31")} {
		if err := x.SetSubnet(s); err == nil {
			t.Errorf("%+v accepted", s)
		}
		if _, err := x.Placement("red", "a", "n1"); !errors.Is(err, ErrUnavailable) {
			t.Errorf("a corrupt subnet still places: %v", err)
		}
	}
}

type nadMap map[string]string

func (m nadMap) NAD(namespace, name string) (*nadv1.NetworkAttachmentDefinition, error) {
	c, ok := m[namespace+"/"+name]
	if !ok {
		return nil, fmt.Errorf("%w %s/%s", ErrNoNAD, namespace, name)
	}
	return &nadv1.NetworkAttachmentDefinition{Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: c}}, nil
}

// TestRequests: the annotation in both of its forms, the NADs' configs, and each way it can be wrong.
func TestRequests(t *testing.T) {
	nads := nadMap{
		"a/red":     `{"cniVersion":"1.0.0","type":"ofsdn","network":"red"}`,
		"a/blue":    `{"cniVersion":"1.0.0","name":"x","plugins":[{"type":"ofsdn","network":"blue"},{"type":"tuning"}]}`,
		"other/red": `{"type":"ofsdn","network":"red"}`,
		"a/macvlan": `{"type":"macvlan","master":"eth1"}`,
		"a/nonet":   `{"type":"ofsdn"}`,
		"a/broken":  `{"type":`,
	}
	for _, tc := range []struct {
		annotation string
		want       string // fmt of the requests, or the error's text
		foreign    string
		err        error
	}{
		{"", "[]", "[]", nil},
		{"red, blue", "[red@net1(a/red) blue@net2(a/blue)]", "[]", nil},
		{"red@left,other/red@right", "[red@left(a/red) red@right(other/red)]", "[]", nil},
		{`[{"name":"red","ips":["10.200.1.9/24"],"mac":"02:00:00:00:00:09"},{"name":"blue","interface":"b1"}]`,
			"[red@net1(a/red) 10.200.1.9 02:00:00:00:00:09 blue@b1(a/blue)]", "[]", nil},
		{"macvlan,red", "[red@net2(a/red)]", "[a/macvlan]", nil},
		{"red@net1,blue@net1", "interface net1 twice", "", ErrBadRequest},
		{"red@eth0", `interface "eth0" is the pod's own`, "", ErrBadRequest},
		{"red@averyveryverylongname", "longer than 15", "", ErrBadRequest},
		{"missing", "no such NetworkAttachmentDefinition a/missing", "", ErrNoNAD},
		{"nonet", "names no Network", "", ErrBadRequest},
		{"broken", "no CNI configuration", "", ErrBadRequest},
		{`[{"name":"red","ips":["10.200.1.9","10.200.1.10"]}]`, "one address per interface", "", ErrBadRequest},
		{`[{"name":"red","ips":["fd00::9"]}]`, "not an IPv4 address", "", ErrBadRequest},
		{`[{"name":"red","mac":"01:00:5e:00:00:01"}]`, "multicast", "", ErrBadRequest},
		{`[{"name":"red","mac":"0a:59:00:ff:f0:01"}]`, "gateways", "", ErrBadRequest},
		{`[{"name":"red"`, "annotation", "", ErrBadRequest},
		{"Bad/Name", "annotation", "", ErrBadRequest},
	} {
		t.Run(tc.annotation, func(t *testing.T) {
			reqs, foreign, err := Requests(tc.annotation, "a", nads)
			if tc.err != nil {
				if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("error %v, want %v saying %q", err, tc.err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range reqs {
				s := fmt.Sprintf("%s@%s(%s)", r.Network, r.Interface, r.NAD)
				if r.IP.IsValid() {
					s += " " + r.IP.String()
				}
				if r.MAC != nil {
					s += " " + r.MAC.String()
				}
				got = append(got, s)
			}
			if g := fmt.Sprint(got); g != tc.want && !(g == "[]" && tc.want == "[]") {
				t.Errorf("requests %s, want %s", g, tc.want)
			}
			if fmt.Sprint(foreign) != tc.foreign && !(len(foreign) == 0 && tc.foreign == "[]") {
				t.Errorf("foreign %v, want %s", foreign, tc.foreign)
			}
		})
	}
}
