package drops

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/debugapi"
	"github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
)

// packetIn lays out an OpenFlow 1.3 packet-in as OVS sends one for a controller action.
func packetIn(table openflow.TableID, cookie uint64, inPort uint32, tunID uint64, regs map[int]uint32, data []byte) []byte {
	var oxm []byte
	put := func(class uint16, field uint8, v []byte) {
		oxm = binary.BigEndian.AppendUint16(oxm, class)
		oxm = append(oxm, field<<1, byte(len(v)))
		oxm = append(oxm, v...)
	}
	put(0x8000, 0, binary.BigEndian.AppendUint32(nil, inPort))
	if tunID != 0 {
		put(0x8000, 38, binary.BigEndian.AppendUint64(nil, tunID))
	}
	for r := 0; r < 8; r++ {
		if v, ok := regs[r]; ok {
			put(0x0001, uint8(r), binary.BigEndian.AppendUint32(nil, v))
		}
	}
	put(0x0001, 100, []byte{1, 2, 3, 4}) // a field the decoder does not know
	mlen := 4 + len(oxm)
	padded := (mlen + 7) / 8 * 8
	msg := make([]byte, 24, 24+padded+2+len(data))
	msg[0], msg[1] = 4, openflow.TypePacketIn
	binary.BigEndian.PutUint32(msg[8:], 0xffffffff)
	binary.BigEndian.PutUint16(msg[12:], uint16(len(data)))
	msg[14], msg[15] = 1, byte(table)
	binary.BigEndian.PutUint64(msg[16:], cookie)
	msg = binary.BigEndian.AppendUint16(msg, 1)
	msg = binary.BigEndian.AppendUint16(msg, uint16(mlen))
	msg = append(msg, oxm...)
	msg = append(msg, make([]byte, padded-mlen+2)...)
	msg = append(msg, data...)
	binary.BigEndian.PutUint16(msg[2:], uint16(len(msg)))
	return msg
}

// frame is Ethernet + IPv4 + the transport ports.
func frame(src, dst string, proto uint8, sport, dport uint16) []byte {
	b := make([]byte, 14+20+8)
	binary.BigEndian.PutUint16(b[12:], 0x0800)
	ip := b[14:]
	ip[0], ip[9] = 0x45, proto
	copy(ip[12:], netip.MustParseAddr(src).AsSlice())
	copy(ip[16:], netip.MustParseAddr(dst).AsSlice())
	binary.BigEndian.PutUint16(ip[20:], sport)
	binary.BigEndian.PutUint16(ip[22:], dport)
	return b
}

// frame6 is an IPv6 frame (an ICMPv6 header's first bytes) from src to dst.
func frame6(src, dst string) []byte {
	b := make([]byte, 14+40+8)
	binary.BigEndian.PutUint16(b[12:], 0x86dd)
	ip := b[14:]
	ip[0], ip[6], ip[7] = 0x60, 58, 255
	copy(ip[8:], netip.MustParseAddr(src).AsSlice())
	copy(ip[24:], netip.MustParseAddr(dst).AsSlice())
	return b
}

func testSnapshot() *Snapshot {
	mac, _ := net.ParseMAC("0a:58:0a:80:00:03")
	st := pipeline.NodeState{
		Pods: []pipeline.PodState{
			{Namespace: "blue", Name: "a", IP: netip.MustParseAddr("10.128.0.3"), MAC: mac, OFPort: 3, VNID: 12},
			{Namespace: "red", Name: "b", IP: netip.MustParseAddr("10.128.0.4"), OFPort: 4, VNID: 14},
		},
		Policies: []pipeline.PolicyState{{Namespace: "red", Name: "deny-all", Ingress: true, Pods: []pipeline.PolicyPod{{OFPort: 4}}}},
		Networks: []pipeline.NetworkState{{Name: "alpha", VNI: 16773121}},
		Attachments: []pipeline.AttachmentState{{Namespace: "blue", Name: "a", Interface: "net1", Network: "alpha", VNI: 16773121,
			IP: netip.MustParseAddr("10.200.0.3"), OFPort: 7}},
	}
	st.Egress.Namespaces = []pipeline.EgressNamespace{{Name: "blue", Firewall: &pipeline.EgressFirewall{Policy: "fw", Rules: []pipeline.EgressRule{
		{Allow: true, Dsts: []netip.Prefix{netip.MustParsePrefix("192.0.2.8/32")}},
		{Dsts: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}},
	}}}}
	owners := map[uint32]reconcile.Owner{}
	for _, o := range []reconcile.Owner{pipeline.AdminPolicyOwner("no-egress"), pipeline.EgressFirewallOwner("blue", "fw"), pipeline.PipelineOwner, pipeline.PodOwner("red", "b"), pipeline.PodOwner("blue", "a"),
		pipeline.TunnelGuardOwner, {Category: reconcile.CategoryService, Name: "blue/empty:http"}} {
		owners[o.Hash()] = o
	}
	return &Snapshot{Node: "n1", State: st, Owners: func(c reconcile.Cookie) []reconcile.Owner {
		if o, ok := owners[c.OwnerHash()]; ok {
			return []reconcile.Owner{o}
		}
		return nil
	}}
}

func cookieOf(o reconcile.Owner) uint64 { return uint64(reconcile.MakeCookie(1, o)) }

func TestDecode(t *testing.T) {
	snap := testSnapshot()
	now := time.Date(2026, 11, 27, 3, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name                 string
		msg                  []byte
		cause, src, dst, obj string
		port                 uint16
		policies             []string
		verdictHas           string
	}{
		{"tenant isolation", packetIn(80, cookieOf(pipeline.PipelineOwner), 3, 0, map[int]uint32{0: 12, 1: 14, 2: 4}, frame("10.128.0.3", "10.128.0.4", 6, 40000, 8080)),
			"tenant-isolation", "blue/a", "red/b", "tenant isolation 12 → 14", 8080, nil, "VNID 12 (blue) may not reach VNID 14 (red)"},
		{"ingress default deny", packetIn(80, cookieOf(pipeline.PodOwner("red", "b")), 3, 0, map[int]uint32{2: 4}, frame("10.128.0.3", "10.128.0.4", 17, 1, 53)),
			"policy-ingress", "blue/a", "red/b", "NetworkPolicy red/deny-all", 53, []string{"red/deny-all"}, "no policy allows udp/53"},
		{"egress default deny, no policy known", packetIn(50, cookieOf(pipeline.PodOwner("blue", "a")), 3, 0, nil, frame("10.128.0.3", "192.0.2.9", 6, 1, 443)),
			"policy-egress", "blue/a", "192.0.2.9", "NetworkPolicy isolation of pod blue/a", 443, nil, "egress isolation of pod blue/a"},
		{"anti-spoofing", packetIn(20, cookieOf(pipeline.PipelineOwner), 3, 0, nil, frame("10.128.0.99", "10.128.0.4", 6, 1, 80)),
			"anti-spoofing", "10.128.0.99", "red/b", "anti-spoofing of pod blue/a", 80, nil, "not the port's own"},
		// A pod's IPv6 is dropped unsampled (table 20, priority 1); IPv6 sent to the uplink still meets
		// table 15's sampled miss and reads with its addresses.
		{"uplink source, IPv6", packetIn(15, cookieOf(pipeline.PipelineOwner), 9, 0, nil, frame6("fe80::1", "fe80::2")),
			"uplink-source", "fe80::1", "fe80::2", "uplink ingress: unknown sender", 0, nil, "dropped by uplink ingress"},
		{"tunnel guard", packetIn(60, cookieOf(pipeline.TunnelGuardOwner), 3, 0, nil, frame("10.128.0.3", "198.51.100.2", 17, 1, 4789)),
			"tunnel-guard", "blue/a", "198.51.100.2", "tunnel guard", 4789, nil, "tunnel port 4789"},
		{"forged network VNI", packetIn(10, cookieOf(pipeline.PipelineOwner), 1, 16773121, nil, frame("10.200.9.9", "10.200.0.3", 17, 1, 9)),
			"network-vni", "10.200.9.9", "10.200.0.3", "Network VNI 16773121 from 0.0.0.0", 9, nil, "VNI 16773121"},
		{"network isolation", packetIn(130, cookieOf(pipeline.PipelineOwner), 7, 0, map[int]uint32{0: 16773121}, frame("10.200.0.3", "10.128.0.4", 6, 1, 80)),
			"network-isolation", "blue/a@net1", "10.128.0.4", "Network alpha", 80, nil, "Network alpha does not reach 10.128.0.4"},
		{"egress firewall", packetIn(55, cookieOf(pipeline.EgressFirewallOwner("blue", "fw")), 3, 0, nil, frame("10.128.0.3", "192.0.2.80", 6, 1, 443)),
			"egress-firewall", "blue/a", "192.0.2.80", "EgressNetworkPolicy blue/fw", 443, nil, "rule 1 (Deny 192.0.2.0/24)"},
		{"cluster network policy", packetIn(52, cookieOf(pipeline.AdminPolicyOwner("no-egress")), 3, 0, nil, frame("10.128.0.3", "10.128.0.4", 6, 1, 80)),
			"cluster-network-policy", "blue/a", "red/b", "ClusterNetworkPolicy no-egress", 80, nil, "(Baseline tier, egress)"},
		{"service without endpoints", packetIn(40, cookieOf(reconcile.Owner{Category: reconcile.CategoryService, Name: "blue/empty:http"}), 3, 0, nil, frame("10.128.0.3", "172.30.0.9", 6, 1, 80)),
			"service-no-endpoints", "blue/a", "172.30.0.9", "Service blue/empty (port http)", 80, nil, "rejected"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pin, err := openflow.ParsePacketIn(tc.msg)
			if err != nil {
				t.Fatal(err)
			}
			d, ok := Decode(pin, snap, now)
			if !ok {
				t.Fatal("not decoded as a drop")
			}
			if d.Cause != tc.cause || d.Src != tc.src || d.Dst != tc.dst || d.Object != tc.obj || d.Port != tc.port || d.Node != "n1" ||
				strings.Join(d.Policies, ",") != strings.Join(tc.policies, ",") || !strings.Contains(d.Verdict, tc.verdictHas) {
				t.Errorf("got %+v\nwant cause %s %s → %s port %d object %q policies %v verdict containing %q", d, tc.cause, tc.src, tc.dst, tc.port, tc.obj, tc.policies, tc.verdictHas)
			}
		})
	}
	pin, _ := openflow.ParsePacketIn(packetIn(100, 0, 3, 0, nil, frame("10.128.0.3", "10.128.0.4", 6, 1, 2)))
	if _, ok := Decode(pin, snap, now); ok {
		t.Error("a packet-in from a table without a cause is not a drop")
	}
	if _, err := openflow.ParsePacketIn([]byte{4, 10, 0, 8, 0, 0, 0, 0}); err == nil {
		t.Error("a truncated packet-in must not parse")
	}
}

func TestQueryMatch(t *testing.T) {
	now := time.Now()
	d := debugapi.Drop{Time: now.Add(-time.Minute), Src: "blue/a", Dst: "red/b@net1"}
	for _, tc := range []struct {
		q    debugapi.DropQuery
		want bool
	}{
		{debugapi.DropQuery{}, true},
		{debugapi.DropQuery{Namespace: "blue"}, true},
		{debugapi.DropQuery{Namespace: "red", Pod: "b"}, true},
		{debugapi.DropQuery{Namespace: "red", Pod: "a"}, false},
		{debugapi.DropQuery{Pod: "a"}, true},
		{debugapi.DropQuery{Namespace: "green"}, false},
		{debugapi.DropQuery{Since: 30 * time.Second}, false},
		{debugapi.DropQuery{Since: 2 * time.Minute, Namespace: "blue"}, true},
	} {
		if got := tc.q.Match(d, now); got != tc.want {
			t.Errorf("%+v: %v, want %v", tc.q, got, tc.want)
		}
	}
	if (debugapi.DropQuery{Namespace: "x"}).Match(debugapi.Drop{Src: "10.0.0.1", Dst: "10.0.0.2"}, now) {
		t.Error("addresses are in no namespace")
	}
}

func TestRing(t *testing.T) {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(i int) debugapi.Drop {
		return debugapi.Drop{Time: base.Add(time.Duration(i) * time.Second), Src: "ns/p", Verdict: "v"}
	}
	for _, tc := range []struct {
		size, added int
		wantFirst   int
	}{
		{4, 0, -1}, {4, 3, 0}, {4, 4, 0}, {4, 5, 1}, {4, 11, 7},
	} {
		r := NewRing(tc.size)
		for i := 0; i < tc.added; i++ {
			r.Add(at(i))
		}
		got := r.Recent(debugapi.DropQuery{}, base.Add(time.Hour))
		want := min(tc.added, tc.size)
		if len(got) != want {
			t.Fatalf("size %d added %d: %d records, want %d", tc.size, tc.added, len(got), want)
		}
		for i, d := range got {
			if !d.Time.Equal(at(tc.wantFirst + i).Time) {
				t.Errorf("size %d added %d: record %d is %v, want oldest first from %d", tc.size, tc.added, i, d.Time, tc.wantFirst)
			}
		}
	}
	// Follow: the recent ones, then new ones as they come, until ctx ends.
	r := NewRing(8)
	r.Add(at(0))
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan debugapi.Drop, 8)
	done := make(chan error)
	go func() {
		done <- r.Stream(ctx, debugapi.DropQuery{Follow: true}, func() time.Time { return base.Add(time.Hour) }, func(d debugapi.Drop) error {
			got <- d
			return nil
		})
	}()
	if d := <-got; !d.Time.Equal(at(0).Time) {
		t.Fatalf("first %v", d.Time)
	}
	for { // the follower subscribes before it reads the ring: add until it sees a new one
		r.Add(at(1))
		select {
		case d := <-got:
			if !d.Time.Equal(at(1).Time) {
				t.Fatalf("followed %v", d.Time)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}
