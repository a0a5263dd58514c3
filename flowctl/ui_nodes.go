package flowctl

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"sort"
	"strings"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/debugapi"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The nodes pages: each Node with its HostSubnet and what its agent says of itself through the debug
// API (answering or not, round, pipeline version, mode, bridge ports), and one node in full.

func nodeInfo(ctx context.Context, b debugapi.Backend) (*debugapi.NodeInfo, error) {
	return b.Node(ctx)
}

func addrString(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

type uiNodes struct {
	Encapsulation networkv1.Encapsulation
	Mode          networkv1.PluginMode
	// FlowctlPipeline is the pipeline version this flowctl reads traces and dumps with.
	FlowctlPipeline uint32
	Rows            []uiNodeRow
	Attention       []string
}

type uiNodeRow struct {
	Name       string
	Ready      bool
	ReadyText  string
	InternalIP string
	Subnet     string // the HostSubnet's
	HostIP     string
	// SubnetProblem says what is wrong with the node's HostSubnet (none, or hostIP not the node's
	// address).
	SubnetProblem string
	Agent         agentAnswer[debugapi.NodeInfo]
	// Ports the agent's bridge has for the overlay: vxlan0, patch-uplink.
	Tunnel string
}

// nodeRows reads every node's agent at once and says what needs attention.
func (s *uiServer) nodeRows(ctx context.Context, o *clusterObjects) uiNodes {
	v := uiNodes{FlowctlPipeline: pipeline.PipelineVersion}
	if o.cn != nil {
		v.Encapsulation, v.Mode = o.cn.Spec.Encapsulation, o.cn.Spec.PluginMode
		if v.Encapsulation == "" {
			v.Encapsulation = networkv1.EncapsulationVXLAN
		}
	}
	subnets := map[string]networkv1.HostSubnet{}
	for _, hs := range o.hostSubnets {
		subnets[hs.Name] = hs
	}
	names := make([]string, 0, len(o.nodes))
	for _, n := range o.nodes {
		names = append(names, n.Name)
	}
	infos := askAgents(ctx, s, names, nodeInfo)
	versions := map[uint32][]string{}
	for _, n := range o.nodes {
		row := uiNodeRow{Name: n.Name, Agent: infos[n.Name], ReadyText: "unknown"}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				row.Ready, row.ReadyText = c.Status == corev1.ConditionTrue, string(c.Status)
				if !row.Ready && c.Reason != "" {
					row.ReadyText += " (" + c.Reason + ")"
				}
			}
		}
		if ip, ok := nodeIP(&n); ok {
			row.InternalIP = ip.String()
		}
		if hs, ok := subnets[n.Name]; ok {
			row.Subnet, row.HostIP = string(hs.Subnet), hs.HostIP
			if row.InternalIP != "" && hs.HostIP != row.InternalIP {
				row.SubnetProblem = fmt.Sprintf("HostSubnet's hostIP %s is not the node's address %s", hs.HostIP, row.InternalIP)
			}
		} else if o.hostSubnets != nil {
			row.SubnetProblem = "no HostSubnet: the node has no pod subnet"
		}
		if row.SubnetProblem != "" {
			v.Attention = append(v.Attention, "node "+n.Name+": "+row.SubnetProblem)
		}
		if a := row.Agent; a.OK() {
			info := a.Value
			versions[info.PipelineVersion] = append(versions[info.PipelineVersion], n.Name)
			var tunnels []string
			for _, p := range info.Ports {
				if p.Name == pipeline.PortNameVXLAN || p.Name == pipeline.PortNameUplink {
					tunnels = append(tunnels, p.Name)
				}
			}
			sort.Strings(tunnels)
			row.Tunnel = strings.Join(tunnels, ", ")
			if v.Mode != "" && info.Mode != string(v.Mode) {
				v.Attention = append(v.Attention, fmt.Sprintf("node %s: its agent renders %s mode, the ClusterNetwork says %s", n.Name, info.Mode, v.Mode))
			}
		} else {
			v.Attention = append(v.Attention, "node "+n.Name+": agent not answering: "+a.Err)
		}
		v.Rows = append(v.Rows, row)
	}
	if len(versions) > 1 {
		keys := make([]uint32, 0, len(versions))
		for k := range versions {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		msg := "agents run different pipeline versions:"
		for _, k := range keys {
			msg += fmt.Sprintf(" %d on %v;", k, versions[k])
		}
		v.Attention = append(v.Attention, msg[:len(msg)-1])
	}
	for ver, nodes := range versions {
		if ver != pipeline.PipelineVersion {
			v.Attention = append(v.Attention, fmt.Sprintf("this flowctl reads pipeline version %d; nodes %v run %d: traces there may misname tables", pipeline.PipelineVersion, nodes, ver))
		}
	}
	sort.Strings(v.Attention)
	return v
}

func (s *uiServer) nodes(ctx context.Context, _ *http.Request, p *uiPage) {
	p.Title, p.Refresh = "Nodes", 10
	o := s.readObjects(ctx, p, objectsNeeded{cn: true, nodes: true, hostSubnets: true})
	v := s.nodeRows(ctx, o)
	p.Data = &v
}

type uiNode struct {
	Row   uiNodeRow
	Info  *debugapi.NodeInfo
	VNIDs []uiVNID
	Drift agentAnswer[debugapi.Diff]
}

type uiVNID struct {
	Namespace string
	VNID      uint32
}

func (s *uiServer) node(ctx context.Context, r *http.Request, p *uiPage) {
	name := r.PathValue("name")
	p.Title, p.Section, p.Refresh = "Node "+name, "nodes", 10
	o := s.readObjects(ctx, p, objectsNeeded{cn: true, nodes: true, hostSubnets: true})
	i := slices.IndexFunc(o.nodes, func(n corev1.Node) bool { return n.Name == name })
	if i < 0 {
		if len(p.Problems) == 0 {
			p.status = http.StatusNotFound
			p.problem("reading node "+name, apierrors.NewNotFound(schema.GroupResource{Resource: "nodes"}, name))
		}
		return
	}
	o.nodes = o.nodes[i : i+1]
	rows := s.nodeRows(ctx, o)
	v := &uiNode{Row: rows.Rows[0], Info: rows.Rows[0].Agent.Value}
	if v.Info != nil {
		for ns, id := range v.Info.VNIDs {
			v.VNIDs = append(v.VNIDs, uiVNID{ns, id})
		}
		sort.Slice(v.VNIDs, func(i, j int) bool { return v.VNIDs[i].Namespace < v.VNIDs[j].Namespace })
		v.Drift = askAgent(ctx, s, name, func(ctx context.Context, b debugapi.Backend) (*debugapi.Diff, error) { return b.Diff(ctx) })
	}
	p.Data = v
}
