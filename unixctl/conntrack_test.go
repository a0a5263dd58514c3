package unixctl

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParseConntrack(t *testing.T) {
	out := `udp,orig=(src=10.128.0.5,dst=172.30.0.10,sport=40000,dport=53),reply=(src=10.128.2.7,dst=10.128.0.5,sport=8080,dport=40000),zone=65520
tcp,orig=(src=10.128.0.5,dst=10.128.2.7,sport=51000,dport=8080),reply=(src=10.128.2.7,dst=10.128.0.5,sport=8080,dport=51000),zone=65520,mark=1,protoinfo=(state=ESTABLISHED)
icmp,orig=(src=10.128.0.5,dst=10.128.2.7,id=7,type=8,code=0),reply=(src=10.128.2.7,dst=10.128.0.5,id=7,type=0,code=0),zone=65520
`
	got, err := ParseConntrack(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("%d entries: %+v", len(got), got)
	}
	a := netip.MustParseAddr
	want0 := ConntrackEntry{Protocol: 17, Zone: 65520,
		Orig:  Tuple{Src: a("10.128.0.5"), Dst: a("172.30.0.10"), SrcPort: 40000, DstPort: 53},
		Reply: Tuple{Src: a("10.128.2.7"), Dst: a("10.128.0.5"), SrcPort: 8080, DstPort: 40000}}
	if got[0] != want0 {
		t.Errorf("udp entry %+v, want %+v", got[0], want0)
	}
	if got[1].Protocol != 6 || got[1].Reply.SrcPort != 8080 || got[1].Zone != 65520 {
		t.Errorf("tcp entry with extra fields %+v", got[1])
	}
	if got[2].Protocol != 1 || got[2].Orig.Dst != a("10.128.2.7") || got[2].Orig.DstPort != 0 {
		t.Errorf("icmp entry %+v", got[2])
	}
	for _, bad := range []string{"udp", "gre,orig=(src=1.2.3.4,dst=1.2.3.5),reply=(src=1.2.3.5,dst=1.2.3.4)",
		"udp,orig=(src=x,dst=1.2.3.5),reply=(src=1.2.3.5,dst=1.2.3.4)", "udp,orig=(src=1.2.3.4,dst=1.2.3.5)"} {
		if _, err := ParseConntrack(bad); err == nil || !strings.Contains(err.Error(), bad[:3]) {
			t.Errorf("%q: err %v, want one quoting the line", bad, err)
		}
	}
}
