// Package ofswitch is ofsdn's OpenFlow 1.3 session to one Open vSwitch bridge: connect to the bridge's
// management socket (<rundir>/<bridge>.mgmt), negotiate OpenFlow 1.3 only, keep the connection alive
// with echoes, match replies to requests by xid, collect every chunk of multipart replies, apply atomic
// bundles, and reconnect with backoff and a replay hook when ovs-vswitchd goes away.
//
// Why it exists: antrea.io/ofnet speaks only OpenFlow 1.5 (and reads only the first chunk of a flow
// dump), while ofsdn's bridge speaks 1.3. The session connects actively to the management socket and
// never sets a controller in OVSDB: setting or removing a controller flushes every flow and group of
// the bridge (shared/LAB.md).
//
// It is a transport: it moves complete OpenFlow 1.3 messages as bytes and knows nothing of ofsdn's flow
// model. flows/openflow encodes and decodes them and names every protocol number the session uses
// (message and bundle-control types); FlowsSwitch adapts a Session to reconcile.Switch.
//
// Bundles are atomic: Bundle opens an ONF bundle (extension 2300, flags ATOMIC|ORDERED), pipelines
// every message as a bundle-add, and then a barrier. OVS decodes each bundle-add as it arrives and
// rejects a malformed one on its own, yet would still commit the rest of the bundle; so Bundle
// commits only once the barrier's reply has shown that every add was accepted, and discards the
// bundle otherwise. Errors found at commit (e.g. a flow naming a group that does not exist) fail the
// whole commit, and OVS installs nothing.
package ofswitch
