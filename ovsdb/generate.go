package ovsdb

// The models are generated from the full schema, not written by hand: libovsdb's MonitorAll and cache
// reject models that miss columns the server sends (LAB.md: "column link_speed not found"). The schema is
// a copy of OVS 3.1's /usr/share/openvswitch/vswitch.ovsschema so generation does not depend on the host.
//go:generate go tool modelgen -p vswitch -o vswitch vswitch.ovsschema
