// Package openflow is ofsdn's OpenFlow 1.3 vocabulary and codec: typed match fields, matches,
// actions, flows and groups that print themselves as ovs-ofctl does, and every byte of the wire
// format ofsdn speaks — flow-mods and group-mods laid out from compiled flows, flow-stats and
// group-desc entries decoded strictly (a switch's reply is input that must never crash the agent),
// message framing, hello, bundles, multipart, errors, and Open vSwitch's conntrack flush.
//
// It opens no connection or file and never logs (ReadMessage frames bytes from a reader its caller
// owns): ofswitch carries the messages over a connection; flows/pipeline renders ofsdn's flows in its
// terms; flows/reconcile diffs compiled flows by FlowKey.
//
// Files: fields.go (Field, SubField), match.go (Match), actions.go (Action types), flow.go (Flow,
// GroupEntry), codec.go (Compile, FlowKey, flow-mods, flow stats, groups), wire.go (framing, bundles,
// multipart, ports, and the protocol's numbers: one name each), errors.go (OFPT_ERROR names), ctflush.go (NXT_CT_FLUSH).
package openflow
