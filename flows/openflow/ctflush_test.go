package openflow

import (
	"encoding/hex"
	"net/netip"
	"strings"
	"testing"
)

func TestEncodeConntrackFlush(t *testing.T) {
	// What `ovs-ofctl -O OpenFlow13 ct-flush br0 zone=65520 ct_nw_dst=172.30.0.10,ct_nw_proto=17,ct_tp_dst=53
	// ct_nw_src=10.128.0.5` (OVS 3.1) sends, xid cleared.
	want := strings.ReplaceAll(`04 04 00 68 00 00 00 00 00 00 23 20 00 00 00 20 11 00 00 00 00 00 00 00
		00 00 00 28 00 00 00 00 00 01 00 14 00 00 00 00 00 00 00 00 00 00 ff ff ac 1e 00 0a 00 00 00 00
		00 03 00 08 00 35 00 00 00 01 00 20 00 00 00 00 00 00 00 14 00 00 00 00 00 00 00 00 00 00 ff ff
		0a 80 00 05 00 00 00 00 00 02 00 08 ff f0 00 00`, " ", "")
	want = strings.Join(strings.Fields(want), "")
	got := EncodeConntrackFlush(0xfff0, ConntrackFlush{Protocol: IPProtoUDP, Dst: netip.MustParseAddr("172.30.0.10"),
		DstPort: 53, ReplySrc: netip.MustParseAddr("10.128.0.5")})
	if hex.EncodeToString(got) != want {
		t.Errorf("got  %x\nwant %s", got, want)
	}
	// Nothing but the zone: the length still adds up.
	z := EncodeConntrackFlush(7, ConntrackFlush{})
	if len(z) != 32 || int(z[2])<<8|int(z[3]) != len(z) {
		t.Errorf("zone-only flush: %x", z)
	}
}
