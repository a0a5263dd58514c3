package ovsdb

import "context"

// System is what the Open_vSwitch table says about the switch: ovs-vswitchd fills in the datapath and
// interface types it supports when it starts; the version is what the distribution's start script
// recorded, if anything.
type System struct {
	OVSVersion    string
	DatapathTypes []string
	IfaceTypes    []string
}

// System reads the Open_vSwitch row.
func (c *Client) System(ctx context.Context) (System, error) {
	root, err := c.root(ctx)
	if err != nil {
		return System{}, err
	}
	s := System{DatapathTypes: root.DatapathTypes, IfaceTypes: root.IfaceTypes}
	if root.OVSVersion != nil {
		s.OVSVersion = *root.OVSVersion
	}
	return s, nil
}

// BridgeProtocols returns the OpenFlow versions a bridge allows (empty: Open vSwitch's default set),
// and whether the bridge exists.
func (c *Client) BridgeProtocols(ctx context.Context, name string) ([]string, bool, error) {
	br, err := c.bridge(ctx, name)
	if err != nil || br == nil {
		return nil, false, err
	}
	protos := make([]string, 0, len(br.Protocols))
	for _, p := range br.Protocols {
		protos = append(protos, string(p))
	}
	return protos, true, nil
}
