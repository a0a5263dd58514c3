// Package agent is ofsdn's node agent: informers and CNI requests feed a nodeView (plain data),
// pipeline.Render turns it into desired flows per owner, and flowSync applies the owners that changed
// in one bundle through reconcile.Reconciler.
//
// Where each thing lives:
//
//   - agent.go: New wires the view, informers and handlers from its Deps (clients, OVSDB, a way to
//     dial the bridge) without I/O; Run takes the named start-up steps in order (open the bridge, sync
//     informers, wait for the node's subnet, set up the node, restore pods, install this round, serve
//     CNI); the package-level Run checks the node's prerequisites (preflight/) and makes real Deps from
//     a Config. Each feature's package gets its dependencies at construction and sees the agent through
//     small interfaces of its own (a View the nodeView implements, the flow loop as a Sync); agent.go
//     also holds the few adapters over several parts (nodeAPIAgent, counts, dropSnapshot, the Events
//     on pods and the Node, the routes loop's syncRoutes).
//   - view.go: nodeView, the one picture of the node every flow is rendered from; its generation counter
//     lets a CNI ADD wait for exactly its own change. Its lock stays in view.go: the features change it
//     through methods (RecordPolicyChange, UpdateNetworks, Change, SetService, SetHostPorts, ...).
//   - informers.go: ClusterNetwork, HostSubnets and NetNamespaces into the view's own fields (mode,
//     addressing, remote nodes, VNIDs), and other nodes' pods (watchRemotePods).
//   - services/ (its own package): its Watch files the Services and EndpointSlices informers' objects
//     in the view (services.View), which keeps them as the cache gave them; it turns them into
//     pipeline.ServiceState (with a conversion cache, so one endpoint change converts one service) and
//     serves LoadBalancer services' health check node ports, which hostSync
//     keeps in step with each synced state.
//   - policy/ (its own package): NetworkPolicy resolution — policies, every pod of the cluster and
//     namespaces into pipeline.PolicyState for the policies that select a local pod, and the pods'
//     isolation; incremental, so one pod's change resolves only the policies it can affect. The flow
//     loop owns its index and resolves there, outside the view's lock (networkpolicy mode). Its Watch
//     is their informers' handlers (pods cluster-wide, kept as compact k8sobj.Pods by the informers'
//     transform k8sobj.Trim), filing changes in the view through policy.View (view.go); its
//     ProblemReporter, the Warning Events of policies enforced only in part.
//   - adminpolicy/ (its own package): ClusterNetworkPolicy resolution — policies (read through the
//     dynamic client into apis/policy/v1beta1), pods, namespaces and nodes into
//     pipeline.AdminPolicyState, incremental like policy/, in every mode; its Watch (watch.go) is their
//     informers' handlers (the policies' informer runs only when the API server serves them: Served),
//     filing changes through adminpolicy.View; its Reporter (report.go), the NotEnforced / Enforced
//     Events on each policy that the controller aggregates into its status.
//   - hostside.go: the node's own side through nodenet — routes, tun0, nf_tables SNAT, NodePort and
//     hostPort forwards (hostnet resolves this node's pods' hostPorts and tells HostPortConflict
//     Events) — and hostSync, the loop that carries synced states there (applyHost; it
//     flushes stale UDP conntrack, at start those conntrack holds against the first state, then reads
//     conntrack again to verify each flush) off the flow path.
//   - attach/ (its own package): the CNI verbs (IPAM in ipam/, the veth in podnet/, the OVS port with
//     its external_ids); a repeated ADD of an intact attachment answers with its result and changes
//     nothing; after a restart every attachment's pieces (OVS port, reservation, marked veth, pending
//     DEL) are checked against its netns, the API server and newer sandboxes: the live ones come back,
//     the rest are released; the janitor serves the DELs the plugin left while no agent could take
//     them. It sees the view through attach.Node (view.go) and the flow loop through attach.Flows.
//   - networks/ (its own package): Networks (network.ofsdn.io) — the Networks, their node subnets and
//     the namespaces' labels into the view's networks.Index (networks.Watch, through networks.View),
//     which gives the pipeline its NetworkStates and the attachments that carry traffic (admitted); a
//     pod's k8s.v1.cni.cncf.io/networks annotation resolved through its NetworkAttachmentDefinitions
//     (networks.PodRequests) for attach/, which plumbs each interface (attach/networks.go); the
//     Reporter writing NetworkSubnet status and the pods' network-status. The routes loop keeping
//     running pods' cross-talk routes in step (attach.Handler.SyncRoutes) is agent.go's syncRoutes.
//   - flowsync.go: render, diff per owner, one Apply; concurrent callers coalesce; failing owners keep
//     their last good flows and are retried with back-off; resyncs (reconnect, periodic) run in its loop.
//     Owner failures become Warning Events (FlowsNotInstalled, on the Pod, Service, NetworkPolicy or
//     Node the owner renders); the owner index is saved for flowctl.
//   - hostnet/ (its own package): the node's host-side jobs beyond nodenet's plumbing — encapsulation
//     none's uplink port (br0's patch port into the OVS bridge holding the node's address, which peers
//     are on its segment, an EncapsulationFallback Event when the node cannot, tun0's MAC), ovs-
//     vswitchd's tunnel neighbours checked against the kernel's (userspace datapath), the datapath flow
//     cache purged after policy changes (userspace datapath), and the local pods' hostPorts from the
//     pod informer (WatchHostPorts, through hostnet.HostPortView) resolved oldest first, each conflict
//     told once. informers.go's watchRemotePods keeps other nodes' pods' addresses for the source VNID
//     of unencapsulated traffic (multitenant).
//   - egress/ (its own package): egress IPs and the egress firewall — its Node (node.go) is the
//     informers' handlers putting NetNamespaces, HostSubnets and EgressNetworkPolicies into Inputs, an
//     egressplan.Plan and pipeline.EgressState under their own lock that the view holds and fills into
//     each snapshot (egress.View: the view's generation, the node's address), the Warning Events of
//     unheld IPs (EgressIPUnheld), and PodFlows, so a CNI ADD of a pod of an egress namespace waits for
//     the egress owners too; the membership that decides without the API server which node holds each
//     egress IP (heartbeats over the node network, epochs, a majority for new claims), the claim (SNAT,
//     then flows and the address on the uplink, then gratuitous ARP; carried out in a loop of its own,
//     so a slow claim never delays the heartbeats), the tunnels' next hop to the holder, the
//     firewalls' DNS names resolved with TTL re-resolution, and the holder written to NetNamespace
//     status after the move.
//   - preflight/ (its own package): the node's prerequisites (Open vSwitch's database and switch, the
//     datapath and interface types, OpenFlow 1.3, bundles, the pipeline's features probed in a
//     discarded bundle), checked by the package-level Run before anything else; a missing one stops the
//     agent with one line naming it and the fix (preflight.Error).
//   - round.go: the reconciliation round stamped in cookies (kept in br0's external_ids), so a restarted
//     agent installs its flows beside the previous round's and only then deletes those: no datapath gap.
//   - metrics/ (its own package): the agent's Prometheus metrics (counters where things happen, gauges
//     of the node's state read at scrape time from agent.go's counts), the bundle counter around the
//     reconciler's switch and the CNI handler wrapper that counts and times each verb.
//   - health.go: /healthz (the flow sync loop answers a ping, OVS sessions up or reconnecting) and
//     /readyz, which CNI STATUS shares (first full sync done, CNI socket listening, sessions up).
//   - nodeapi/ (its own package): the node API — the metrics and health server (health.go's handler)
//     and the read-only debug API flowctl asks (debugapi/): the node's view with OVSDB's ports, desired
//     flows by owner, the drift report, the bridge's dump, ofproto/trace through unixctl, the drop
//     stream; served on a root-only socket beside the bridge and on the node's address for the API
//     server's node proxy. It reads the agent through nodeapi.Agent (agent.go's nodeAPIAgent: the view,
//     the flow loop's last synced state, the bridge once open). The node's addresses (debug API,
//     metrics, pprof) speak TLS and go through nodeauth/ (its own package): a bearer token reviewed by
//     the API server, a SubjectAccessReview for what the path needs, and why the token travels in a
//     header of its own through the node proxy.
//   - drops/ (its own package): drop attribution — the drop flows' samples
//     (flows/pipeline/drops.go: controller(max_len=128, meter_id=<the cause's meter>)) arrive as
//     packet-ins on the OpenFlow session (ofswitch asks OVS for them with OFPT_SET_ASYNC), handed over
//     without blocking the session's reader; drops.Decode turns each, against the last synced state and
//     the owner index, into a record (cause, pods or addresses, protocol and port, the deciding object,
//     the policies that isolate a pod for a default deny); a ring of drops.RingSize records, per-cause
//     sample counters (ofsdn_agent_drop_samples_total), and the debug API's NDJSON stream (PathDrops).
//     openBridge installs the meters (and the reconnect hook again) before any flow names them;
//     agent.go's dropSnapshot is what each sample is decoded against.
//
// Tests: informers_test.go and services_test.go run the agent's own informers on fake clientsets and
// check the view (make unit); flowsync_ovs_test.go runs flowSync against a real bridge.
package agent
