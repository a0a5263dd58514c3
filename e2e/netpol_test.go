//go:build e2e

package e2e

// NetworkPolicy on the lab (issue 12's "Must show"): conformance cases modelled on Kubernetes' netpol e2e
// suite, each checked on the full matrix (netpol_fixture_test.go) against e2e/netpolmodel; services; agent
// restarts; input the agent cannot fully render.

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/e2e/netpolmodel"
	"github.com/ofsdn/ofsdn/e2e/testpod"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// Policy builders, in the vocabulary of the API.

type npSpecOption func(*networkingv1.NetworkPolicySpec)

func npPolicy(name string, pods *metav1.LabelSelector, opts ...npSpecOption) *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networkingv1.NetworkPolicySpec{PodSelector: *pods}}
	for _, o := range opts {
		o(&np.Spec)
	}
	return np
}

// npIngress sets the ingress rules (none: deny all ingress) and lists Ingress in policyTypes.
func npIngress(rules ...networkingv1.NetworkPolicyIngressRule) npSpecOption {
	return func(s *networkingv1.NetworkPolicySpec) {
		s.Ingress = append([]networkingv1.NetworkPolicyIngressRule{}, rules...)
		s.PolicyTypes = append(s.PolicyTypes, networkingv1.PolicyTypeIngress)
	}
}

// npEgress sets the egress rules (none: deny all egress) and lists Egress in policyTypes.
func npEgress(rules ...networkingv1.NetworkPolicyEgressRule) npSpecOption {
	return func(s *networkingv1.NetworkPolicySpec) {
		s.Egress = append([]networkingv1.NetworkPolicyEgressRule{}, rules...)
		s.PolicyTypes = append(s.PolicyTypes, networkingv1.PolicyTypeEgress)
	}
}

func npFrom(peers []networkingv1.NetworkPolicyPeer, ports ...networkingv1.NetworkPolicyPort) networkingv1.NetworkPolicyIngressRule {
	return networkingv1.NetworkPolicyIngressRule{From: peers, Ports: ports}
}

func npTo(peers []networkingv1.NetworkPolicyPeer, ports ...networkingv1.NetworkPolicyPort) networkingv1.NetworkPolicyEgressRule {
	return networkingv1.NetworkPolicyEgressRule{To: peers, Ports: ports}
}

func npPeers(p ...networkingv1.NetworkPolicyPeer) []networkingv1.NetworkPolicyPeer { return p }

func npSel(kv ...string) *metav1.LabelSelector {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return &metav1.LabelSelector{MatchLabels: m}
}

func npExpr(key string, op metav1.LabelSelectorOperator, values ...string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: key, Operator: op, Values: values}}}
}

func npPodPeer(s *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: s}
}

func npNSPeer(s *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: s}
}

func npNSPodPeer(ns, pods *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: ns, PodSelector: pods}
}

func npCIDRPeer(cidr string, except ...string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}
}

func npPort(proto corev1.Protocol, port int32) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Protocol: &proto, Port: ptr.To(intstr.FromInt32(port))}
}

func npPortRange(proto corev1.Protocol, port, end int32) networkingv1.NetworkPolicyPort {
	p := npPort(proto, port)
	p.EndPort = &end
	return p
}

// npNamed is a named port; protocol nil leaves it to the API's default (TCP).
func npNamed(name string, proto *corev1.Protocol) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Protocol: proto, Port: ptr.To(intstr.FromString(name))}
}

func npProtocolOnly(proto corev1.Protocol) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Protocol: &proto}
}

var (
	npTCP, npUDP, npSCTP = corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP
	npAll                = &metav1.LabelSelector{}
)

// npNSByName selects a namespace by the API server's kubernetes.io/metadata.name label.
func npNSByName(short string) *metav1.LabelSelector {
	return npSel(corev1.LabelMetadataName, npNS(short))
}

// npStep changes the world; a check of the whole matrix follows each step.
type npStep struct {
	what string
	do   func(t *testing.T, ctx context.Context, f *npFixture)
}

type npCase struct {
	name  string
	steps []npStep
}

func npCreate(what string, nsShort string, nps ...*networkingv1.NetworkPolicy) npStep {
	return npStep{what, func(t *testing.T, ctx context.Context, f *npFixture) {
		for _, np := range nps {
			f.createPolicy(t, ctx, nsShort, np)
		}
	}}
}

// npCases: the Kubernetes netpol suite's cases (names as upstream where they have one), then ofsdn's.
// Expected verdicts come from the model; a case only says what to do.
func npCases(f *npFixture) []npCase {
	podA := npSel("pod", "a")
	notX := npExpr(corev1.LabelMetadataName, metav1.LabelSelectorOpNotIn, npNS("x"))
	return []npCase{
		{"default-deny-ingress", []npStep{npCreate("deny all ingress in x", "x", npPolicy("deny-ingress", npAll, npIngress()))}},
		{"default-deny-all", []npStep{npCreate("deny all in x", "x", npPolicy("deny-all", npAll, npIngress(), npEgress()))}},
		{"allow from pods within the namespace by podSelector", []npStep{npCreate("x/a from pod=b", "x",
			npPolicy("x-a-allows-x-b", podA, npIngress(npFrom(npPeers(npPodPeer(npSel("pod", "b")))))))}},
		{"allow ingress for a target", []npStep{npCreate("deny x, allow all to x/a", "x",
			npPolicy("deny-all", npAll, npIngress()),
			npPolicy("allow-all-to-a", podA, npIngress(npFrom(npPeers(npNSPodPeer(npAll, npAll))))))}},
		{"allow ingress from pods in all namespaces", []npStep{npCreate("x/a from namespaceSelector {}", "x",
			npPolicy("allow-from-all-ns", podA, npIngress(npFrom(npPeers(npNSPeer(npAll))))))}},
		{"allow only from a different namespace by namespaceSelector", []npStep{npCreate("x/a from ns=y", "x",
			npPolicy("allow-from-y", podA, npIngress(npFrom(npPeers(npNSPeer(npSel("ns", "y")))))))}},
		{"podSelector with matchExpressions", []npStep{npCreate("x/a from pod In (b)", "x",
			npPolicy("x-a-allows-b-expr", podA, npIngress(npFrom(npPeers(npPodPeer(npExpr("pod", metav1.LabelSelectorOpIn, "b")))))))}},
		{"namespaceSelector with matchExpressions", []npStep{npCreate("x/a from ns In (y)", "x",
			npPolicy("allow-ns-y-expr", podA, npIngress(npFrom(npPeers(npNSPeer(npExpr("ns", metav1.LabelSelectorOpIn, "y")))))))}},
		{"podSelector or namespaceSelector (two peers)", []npStep{npCreate("x/a from ns NotIn (x), or from pod=b", "x",
			npPolicy("ns-or-pod", podA, npIngress(npFrom(npPeers(npNSPeer(notX), npPodPeer(npSel("pod", "b")))))))}},
		{"podSelector and namespaceSelector (one peer)", []npStep{npCreate("x/a from pod=b in ns NotIn (x)", "x",
			npPolicy("ns-and-pod", podA, npIngress(npFrom(npPeers(npNSPodPeer(notX, npSel("pod", "b")))))))}},
		{"multiple podSelectors and namespaceSelectors", []npStep{npCreate("x/a from pod In (b,c) in ns NotIn (x)", "x",
			npPolicy("ns-and-pods", podA, npIngress(npFrom(npPeers(npNSPodPeer(notX, npExpr("pod", metav1.LabelSelectorOpIn, "b", "c")))))))}},
		{"any of several podSelectors", []npStep{npCreate("x/a from pod=b, from pod=c", "x",
			npPolicy("pod-b-or-c", podA, npIngress(npFrom(npPeers(npPodPeer(npSel("pod", "b")), npPodPeer(npSel("pod", "c")))))))}},
		{"allow only from one pod of another namespace", []npStep{npCreate("x/a from y/a", "x",
			npPolicy("from-y-a", podA, npIngress(npFrom(npPeers(npNSPodPeer(npSel("ns", "y"), podA))))))}},
		{"ingress by port", []npStep{npCreate("x/a from ns=y on TCP 81", "x",
			npPolicy("y-on-81", podA, npIngress(npFrom(npPeers(npNSPeer(npSel("ns", "y"))), npPort(npTCP, 81)))))}},
		{"stacked policies with overlapping podSelectors", []npStep{
			npCreate("x/a from ns=y on TCP 81", "x", npPolicy("y-on-81", podA, npIngress(npFrom(npPeers(npNSPeer(npSel("ns", "y"))), npPort(npTCP, 81))))),
			npCreate("and another: x/a from ns=y on TCP 80", "x", npPolicy("y-on-80", podA, npIngress(npFrom(npPeers(npNSPeer(npSel("ns", "y"))), npPort(npTCP, 80))))),
		}},
		{"allow-all ingress", []npStep{npCreate("x: ingress [{}]", "x", npPolicy("allow-all", npAll, npIngress(npFrom(nil))))}},
		{"ingress on one named port", []npStep{npCreate("x: only serve-81-tcp (port 80 on pods c)", "x",
			npPolicy("named-81", npAll, npIngress(npFrom(nil, npNamed("serve-81-tcp", nil)))))}},
		{"ingress from a namespace on one named port", []npStep{npCreate("x/a from ns=y on serve-80-tcp", "x",
			npPolicy("y-named-80", podA, npIngress(npFrom(npPeers(npNSPeer(npSel("ns", "y"))), npNamed("serve-80-tcp", &npTCP)))))}},
		{"egress on one named port", []npStep{npCreate("x: egress only to serve-80-tcp (each peer's own)", "x",
			npPolicy("egress-named-80", npAll, npEgress(npTo(nil, npNamed("serve-80-tcp", nil)))))}},
		{"named UDP port both ways", []npStep{npCreate("y: ingress on serve-81-udp; z/b: egress on serve-80-udp", "y",
			npPolicy("in-named-udp", npAll, npIngress(npFrom(nil, npNamed("serve-81-udp", &npUDP))))),
			npCreate("z/b egress", "z", npPolicy("out-named-udp", npSel("pod", "b"), npEgress(npTo(nil, npNamed("serve-80-udp", &npUDP))))),
		}},
		{"updated policy", []npStep{
			npCreate("x: allow all ingress", "x", npPolicy("allow-then-deny", npAll, npIngress(npFrom(nil)))),
			{"update it to deny all ingress", func(t *testing.T, ctx context.Context, f *npFixture) {
				f.updatePolicy(t, ctx, "x", npPolicy("allow-then-deny", npAll, npIngress()))
			}},
			{"update it to allow ns=z on UDP", func(t *testing.T, ctx context.Context, f *npFixture) {
				f.updatePolicy(t, ctx, "x", npPolicy("allow-then-deny", npAll, npIngress(npFrom(npPeers(npNSPeer(npSel("ns", "z"))), npProtocolOnly(npUDP)))))
			}},
		}},
		{"ingress from an updated namespace", []npStep{
			npCreate("x/a from ns2=updated", "x", npPolicy("from-ns2", podA, npIngress(npFrom(npPeers(npNSPeer(npSel("ns2", "updated"))))))),
			{"label namespace y ns2=updated", func(t *testing.T, ctx context.Context, f *npFixture) {
				f.setNamespaceLabels(t, ctx, "y", map[string]string{"ns": "y", "ns2": "updated"})
			}},
			{"move the label from y to z", func(t *testing.T, ctx context.Context, f *npFixture) {
				f.setNamespaceLabels(t, ctx, "y", npNamespaceLabels("y"))
				f.setNamespaceLabels(t, ctx, "z", map[string]string{"ns": "z", "ns2": "updated"})
			}},
		}},
		{"ingress from an updated pod", []npStep{
			npCreate("x/a from pod=b,pod2=updated", "x", npPolicy("from-updated-pod", podA,
				npIngress(npFrom(npPeers(npPodPeer(npSel("pod", "b", "pod2", "updated"))))))),
			{"label x/b pod2=updated", func(t *testing.T, ctx context.Context, f *npFixture) {
				f.setPodLabels(t, ctx, "x/b", map[string]string{"pod": "b", "pod2": "updated"})
			}},
		}},
		{"deny ingress from pods of other namespaces", []npStep{npCreate("x: from podSelector {}", "x",
			npPolicy("same-ns-only", npAll, npIngress(npFrom(npPeers(npPodPeer(npAll))))))}},
		{"deny ingress to an updated pod", []npStep{
			npCreate("x: deny ingress to target=isolated", "x", npPolicy("deny-isolated", npSel("target", "isolated"), npIngress())),
			{"label x/a target=isolated", func(t *testing.T, ctx context.Context, f *npFixture) {
				f.setPodLabels(t, ctx, "x/a", map[string]string{"pod": "a", "target": "isolated"})
			}},
			{"take the label away again", func(t *testing.T, ctx context.Context, f *npFixture) {
				f.setPodLabels(t, ctx, "x/a", map[string]string{"pod": "a"})
			}},
		}},
		{"deny egress by podSelector", []npStep{npCreate("x/a: no egress", "x", npPolicy("deny-egress-a", podA, npEgress()))}},
		{"deny egress from all pods of a namespace", []npStep{npCreate("x: no egress", "x", npPolicy("deny-egress-x", npAll, npEgress()))}},
		{"ingress and egress together", []npStep{npCreate("x/a: from pod=b; egress to port 80 only", "x",
			npPolicy("both", podA, npIngress(npFrom(npPeers(npPodPeer(npSel("pod", "b"))))), npEgress(npTo(nil, npPort(npTCP, 80)))))}},
		{"egress denied on the client even though the server allows", []npStep{
			npCreate("x/a: egress only to y/a", "x", npPolicy("to-y-a", podA, npEgress(npTo(npPeers(npNSPodPeer(npSel("ns", "y"), podA)))))),
			npCreate("y/a and y/b: ingress only from x/a", "y",
				npPolicy("from-x-a-on-a", podA, npIngress(npFrom(npPeers(npNSPodPeer(npSel("ns", "x"), podA))))),
				npPolicy("from-x-a-on-b", npSel("pod", "b"), npIngress(npFrom(npPeers(npNSPodPeer(npSel("ns", "x"), podA)))))),
		}},
		{"egress to a server of another namespace by podSelector and namespaceSelector", []npStep{npCreate("x/a: egress to y/a", "x",
			npPolicy("to-y-a", podA, npEgress(npTo(npPeers(npNSPodPeer(npNSByName("y"), podA))))))}},
		{"ingress on any port of one protocol", []npStep{npCreate("x/a: TCP, any port", "x",
			npPolicy("tcp-any-port", podA, npIngress(npFrom(nil, npProtocolOnly(npTCP)))))}},
		{"multiple ingress policies, allow-all wins", []npStep{
			npCreate("x: ingress on port 80 only", "x", npPolicy("only-80", npAll, npIngress(npFrom(nil, npPort(npTCP, 80))))),
			npCreate("x: and allow all ingress", "x", npPolicy("allow-all", npAll, npIngress(npFrom(nil)))),
		}},
		{"multiple egress policies, allow-all wins", []npStep{
			npCreate("x: egress to port 80 only", "x", npPolicy("only-80", npAll, npEgress(npTo(nil, npPort(npTCP, 80))))),
			npCreate("x: and allow all egress", "x", npPolicy("allow-all", npAll, npEgress(npTo(nil)))),
		}},
		{"policies stop applying once deleted", []npStep{
			npCreate("x: deny all; y: deny all ingress", "x", npPolicy("deny-all", npAll, npIngress(), npEgress())),
			npCreate("y too", "y", npPolicy("deny-in", npAll, npIngress())),
			{"delete x's policy", func(t *testing.T, ctx context.Context, f *npFixture) { f.deletePolicy(t, ctx, "x", "deny-all") }},
			{"delete y's policy", func(t *testing.T, ctx context.Context, f *npFixture) { f.deletePolicy(t, ctx, "y", "deny-in") }},
		}},
		{"egress to a server in a CIDR block", []npStep{{"x/a: egress to y/b's address /32", func(t *testing.T, ctx context.Context, f *npFixture) {
			f.createPolicy(t, ctx, "x", npPolicy("to-y-b-cidr", podA, npEgress(npTo(npPeers(npCIDRPeer(f.pods["y/b"].IP.String()+"/32"))))))
		}}}},
		{"egress CIDR with except", []npStep{{"x/a: egress to a /16 around x/b but x/b", func(t *testing.T, ctx context.Context, f *npFixture) {
			f.createPolicy(t, ctx, "x", npPolicy("cidr-except", podA, npEgress(npTo(npPeers(npCIDRPeer(npWiden(f.pods["x/b"].IP, 16), f.pods["x/b"].IP.String()+"/32"))))))
		}}}},
		{"an address in both a CIDR and its except is allowed by another rule", []npStep{
			{"x/a: egress to a /16 around x/b but x/b", func(t *testing.T, ctx context.Context, f *npFixture) {
				f.createPolicy(t, ctx, "x", npPolicy("cidr-except", podA, npEgress(npTo(npPeers(npCIDRPeer(npWiden(f.pods["x/b"].IP, 16), f.pods["x/b"].IP.String()+"/32"))))))
			}},
			{"and another policy: x/a egress to x/b /32", func(t *testing.T, ctx context.Context, f *npFixture) {
				f.createPolicy(t, ctx, "x", npPolicy("to-x-b", podA, npEgress(npTo(npPeers(npCIDRPeer(f.pods["x/b"].IP.String()+"/32"))))))
			}},
		}},
		{"ingress from a CIDR block", []npStep{{"z/c: ingress from y/c's /32 and x's pods' node subnets but x/b's", func(t *testing.T, ctx context.Context, f *npFixture) {
			f.createPolicy(t, ctx, "z", npPolicy("from-cidrs", npSel("pod", "c"), npIngress(npFrom(npPeers(
				npCIDRPeer(f.pods["y/c"].IP.String()+"/32"), npCIDRPeer(npWiden(f.pods["x/b"].IP, 24), f.pods["x/b"].IP.String()+"/32"))))))
		}}}},
		{"ingress and egress controlled independently", []npStep{
			npCreate("x/a: allow all egress", "x", npPolicy("allow-egress", podA, npEgress(npTo(nil)))),
			npCreate("x/a: deny all ingress", "x", npPolicy("deny-ingress", podA, npIngress())),
		}},
		{"SCTP is not TCP", []npStep{npCreate("deny x ingress; x/a allows SCTP 81", "x",
			npPolicy("deny-ingress", npAll, npIngress()),
			npPolicy("sctp-81", podA, npIngress(npFrom(nil, npPort(npSCTP, 81)))))}},
		{"a pod selected by an SCTP-only policy is isolated", []npStep{npCreate("x/a allows SCTP 80", "x",
			npPolicy("sctp-80", podA, npIngress(npFrom(nil, npPort(npSCTP, 80)))))}},
		{"UDP is not TCP", []npStep{npCreate("x/a allows UDP 81", "x", npPolicy("udp-81", podA, npIngress(npFrom(nil, npPort(npUDP, 81)))))}},
		{"namespaceSelector by the default namespace label", []npStep{npCreate("x/a from kubernetes.io/metadata.name=y", "x",
			npPolicy("from-y-by-name", podA, npIngress(npFrom(npPeers(npNSPeer(npNSByName("y")))))))}},
		{"egress namespaceSelector NotIn by the default label", []npStep{npCreate("x/a egress to namespaces NotIn (y)", "x",
			npPolicy("not-to-y", podA, npEgress(npTo(npPeers(npNSPeer(npExpr(corev1.LabelMetadataName, metav1.LabelSelectorOpNotIn, npNS("y"))))))))}},

		// ofsdn's own, beyond the upstream suite.
		{"endPort ranges for ingress", []npStep{npCreate("x/a: TCP 80-81 from ns=y; x/b: TCP 81-90 and UDP 70-80 from all", "x",
			npPolicy("range-a", podA, npIngress(npFrom(npPeers(npNSPeer(npSel("ns", "y"))), npPortRange(npTCP, 80, 81)))),
			npPolicy("range-b", npSel("pod", "b"), npIngress(npFrom(nil, npPortRange(npTCP, 81, 90), npPortRange(npUDP, 70, 80)))))}},
		{"endPort ranges for egress", []npStep{npCreate("z: egress on TCP 79-80 and SCTP 81-1000 only", "z",
			npPolicy("range-out", npAll, npEgress(npTo(nil, npPortRange(npTCP, 79, 80), npPortRange(npSCTP, 81, 1000)))))}},
		{"egress-only policy leaves ingress alone", []npStep{npCreate("y: policyTypes [Egress], egress to ns=x; its ingress rules ignored", "y",
			&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "egress-only"}, Spec: networkingv1.NetworkPolicySpec{
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
				Ingress:     []networkingv1.NetworkPolicyIngressRule{npFrom(npPeers(npPodPeer(npSel("pod", "nobody"))))},
				Egress:      []networkingv1.NetworkPolicyEgressRule{npTo(npPeers(npNSPeer(npSel("ns", "x"))))}}})}},
		{"policyTypes without rules isolate both ways", []npStep{npCreate("y/b: policyTypes [Ingress, Egress], no rules", "y",
			&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "types-only"}, Spec: networkingv1.NetworkPolicySpec{
				PodSelector: *npSel("pod", "b"), PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}}})}},
		{"policyTypes defaulted from the rules", []npStep{npCreate("z/a: ingress from ns=y, egress to ns=x, no policyTypes", "z",
			&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "defaulted"}, Spec: networkingv1.NetworkPolicySpec{
				PodSelector: *podA,
				Ingress:     []networkingv1.NetworkPolicyIngressRule{npFrom(npPeers(npNSPeer(npSel("ns", "y"))))},
				Egress:      []networkingv1.NetworkPolicyEgressRule{npTo(npPeers(npNSPeer(npSel("ns", "x"))))}}})}},
		{"egress to the outside by ipBlock", []npStep{{"x: egress only to the external host", func(t *testing.T, ctx context.Context, f *npFixture) {
			f.createPolicy(t, ctx, "x", npPolicy("to-outside", npAll, npEgress(npTo(npPeers(npCIDRPeer(f.ext.String()+"/32"))))))
		}}}},
		{"egress to everything but the cluster network", []npStep{{"y/c: egress to 0.0.0.0/0 except the cluster CIDRs", func(t *testing.T, ctx context.Context, f *npFixture) {
			cn, err := lc.Net.NetworkV1().ClusterNetworks().Get(ctx, networkv1.ClusterNetworkName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var except []string
			for _, c := range cn.Spec.ClusterCIDRs {
				except = append(except, string(c))
			}
			f.createPolicy(t, ctx, "y", npPolicy("not-cluster", npSel("pod", "c"), npEgress(npTo(npPeers(npCIDRPeer("0.0.0.0/0", except...))))))
		}}}},
		{"a pod recreated on another node", []npStep{
			npCreate("x/a: ingress from pod=b in ns=y only", "x", npPolicy("from-y-b", podA, npIngress(npFrom(npPeers(npNSPodPeer(npSel("ns", "y"), npSel("pod", "b"))))))),
			npCreate("z/c: egress to x/a only", "z", npPolicy("to-x-a", npSel("pod", "c"), npEgress(npTo(npPeers(npNSPodPeer(npSel("ns", "x"), podA)))))),
			{"recreate the peer y/b on another node", func(t *testing.T, ctx context.Context, f *npFixture) {
				f.movePod(t, ctx, "y/b", npOtherNode(f.pods["y/b"].Node))
			}},
			{"recreate the selected x/a on another node", func(t *testing.T, ctx context.Context, f *npFixture) {
				f.movePod(t, ctx, "x/a", npOtherNode(f.pods["x/a"].Node))
			}},
		}},
		{"a relabelled pod leaves one policy's selection and joins another's", []npStep{
			npCreate("x: role=db from role=web only; role=web egress to role=db only", "x",
				npPolicy("db", npSel("role", "db"), npIngress(npFrom(npPeers(npPodPeer(npSel("role", "web")))))),
				npPolicy("web", npSel("role", "web"), npEgress(npTo(npPeers(npPodPeer(npSel("role", "db"))))))),
			{"x/a role=db, x/b role=web", func(t *testing.T, ctx context.Context, f *npFixture) {
				f.setPodLabels(t, ctx, "x/a", map[string]string{"pod": "a", "role": "db"})
				f.setPodLabels(t, ctx, "x/b", map[string]string{"pod": "b", "role": "web"})
			}},
			{"swap: x/a role=web, x/b role=db", func(t *testing.T, ctx context.Context, f *npFixture) {
				f.setPodLabels(t, ctx, "x/a", map[string]string{"pod": "a", "role": "web"})
				f.setPodLabels(t, ctx, "x/b", map[string]string{"pod": "b", "role": "db"})
			}},
		}},
	}
}

// npWiden is the prefix of length bits around ip.
func npWiden(ip netip.Addr, bits int) string {
	p, _ := ip.Prefix(bits)
	return p.String()
}

// npOtherNode is the next lab node after node.
func npOtherNode(node string) string {
	for i, n := range lc.Nodes {
		if n.Name == node {
			return lc.Nodes[(i+1)%len(lc.Nodes)].Name
		}
	}
	return lc.Nodes[0].Name
}

func TestNetworkPolicy(t *testing.T) {
	ctx := ctxT(t, 20*time.Minute)
	began := time.Now()
	f := newNPFixture(t, ctx)
	t.Logf("fixture: 9 pods and the external server up in %s", time.Since(began).Round(time.Millisecond))
	mode, err := currentMode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if mode != networkv1.PluginModeMultitenant {
		if err := lc.SetMode(ctx, networkv1.PluginModeMultitenant); err != nil {
			t.Fatal(err)
		}
	}
	if !t.Run("harness sees tenant isolation", func(t *testing.T) { f.tenantCheck(t, ctx) }) {
		t.Fatal("the probe matrix cannot be trusted")
	}
	if err := lc.SetMode(ctx, networkv1.PluginModeNetworkPolicy); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lc.SetMode(context.Background(), mode); err != nil {
			t.Errorf("restore pluginMode %s: %v", mode, err)
		}
	})
	if f.noSCTP != "" {
		t.Logf("SCTP is not probed: %s", f.noSCTP)
	}
	if !t.Run("networkpolicy mode without policies connects everyone", func(t *testing.T) { f.check(t, ctx, "no policies") }) {
		t.Fatal("networkpolicy mode without policies is not a flat network")
	}
	cases := npCases(f)
	// A case whose policies are gone but whose effect stays fails its reset; the next cases still run
	// (their own checks say what they see), but not after 3 such resets in a row.
	failedResets := 0
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, s := range c.steps {
				s.do(t, ctx, f)
				f.check(t, ctx, s.what)
			}
		})
		f.reset(t, ctx)
		if t.Run("reset after "+c.name, func(t *testing.T) { f.check(t, ctx, "back to no policies") }) {
			failedResets = 0
		} else if failedResets++; failedResets == 3 {
			t.Fatalf("the lab did not return to the flat network after 3 cases in a row (the last %q): later cases cannot be trusted", c.name)
		}
	}
	t.Logf("%d cases; convergence: %s", len(cases), f.convergenceSummary())
	t.Run("nodes reach their own pods through deny-all", func(t *testing.T) { npNodesCase(t, ctx, f) })
	f.reset(t, ctx)
	t.Run("through services", func(t *testing.T) { npServicesCase(t, ctx, f) })
	f.reset(t, ctx)
	t.Run("bad input", func(t *testing.T) { npBadInputCase(t, ctx, f) })
	f.reset(t, ctx)
	t.Run("established connections follow policy changes", func(t *testing.T) { npEstablishedCase(t, ctx, f) })
	f.reset(t, ctx)
	t.Run("agent restarts", func(t *testing.T) { npRestartCase(t, ctx, f) })
	f.reset(t, ctx)
	t.Logf("suite took %s; convergence over every check: %s", time.Since(began).Round(time.Second), f.convergenceSummary())
}

// npNodesCase: with every namespace denying all ingress, each node still reaches the pods on itself
// (kubelet's probes) and no other node reaches any pod.
func npNodesCase(t *testing.T, ctx context.Context, f *npFixture) {
	for _, ns := range npShortNamespaces {
		f.createPolicy(t, ctx, ns, npPolicy("deny-ingress", npAll, npIngress()))
	}
	f.check(t, ctx, "deny all ingress everywhere")
	world, pods, err := f.snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(npConverge)
	for {
		var wrong []string
		for _, n := range lc.Nodes {
			args := []string{"probe-all", "--timeout", npProbeTimeout.String()}
			for _, key := range f.keys {
				args = append(args, "tcp/"+netip.AddrPortFrom(f.pods[key].IP, 80).String())
			}
			var res []testpod.Result
			if err := runNPTestpod(ctx, n.NetNS, &res, args...); err != nil || len(res) != len(f.keys) {
				t.Fatalf("probe from node %s: %v (%d results)", n.Name, err, len(res))
			}
			// A node reaches the cluster network through tun0, from its subnet's gateway address.
			subnet, err := lc.Subnet(ctx, n.Name)
			if err != nil {
				t.Fatal(err)
			}
			for k, key := range f.keys {
				v, err := world.Allowed(netpolmodel.NodeEndpoint(n.Name, subnet.Addr().Next()), netpolmodel.PodEndpoint(pods[key]), 80, corev1.ProtocolTCP)
				if err != nil {
					t.Fatal(err)
				}
				got := res[k].Error == "" && strings.HasPrefix(res[k].Reply, f.pods[key].Key()+" ")
				if got != v.Allowed {
					wrong = append(wrong, fmt.Sprintf("node %s → %s tcp/80: expected %s; got %v (%s%s)", n.Name, key, v, got, res[k].Reply, res[k].Error))
				}
			}
		}
		if len(wrong) == 0 {
			t.Logf("each node reaches exactly its own 3 pods through deny-all ingress")
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d node → pod verdicts differ from the model:\n%s", len(wrong), strings.Join(wrong, "\n"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}
