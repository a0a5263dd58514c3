// Package agent is ofsdn's node agent: informers and CNI requests feed a nodeView (plain data), flows.Render
// turns it into desired flows per owner, and flowSync reconciles the owners that changed in one bundle.
//
// Where each thing lives:
//
//   - agent.go: Run — OVSDB and OpenFlow sessions, the round, informers, start-up order, the sync loop and
//     its afterSync hook (conntrack flushes for removed UDP endpoints, host forwards).
//   - view.go: nodeView, the one picture of the node every flow is rendered from; its generation counter
//     lets a CNI ADD wait for exactly its own change.
//   - informers.go: ClusterNetwork, HostSubnets and NetNamespaces into the view.
//   - services.go: Services and EndpointSlices into flows.ServiceState (with a conversion cache, so one
//     endpoint change converts one service).
//   - hostside.go: the node's own side through nodenet — routes, tun0, nf_tables SNAT, NodePort and
//     hostPort forwards, and HostPortConflict Events (the oldest pod keeps a contested hostPort).
//   - cnihandler.go: the CNI verbs (IPAM in ipam/, the veth in podnet/, the OVS port with its external_ids)
//     and the restore of existing pods from OVSDB and the address store after a restart.
//   - flowsync.go: render, diff per owner, one bundle; concurrent callers coalesce into one sync.
//   - round.go: the reconciliation round stamped in cookies (kept in br0's external_ids), so a restarted
//     agent installs its flows beside the previous round's and only then deletes those: no datapath gap.
package agent
