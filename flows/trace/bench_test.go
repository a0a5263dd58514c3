package trace

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/internal/ofbridge"
	"github.com/ofsdn/ofsdn/unixctl"
)

// BenchmarkTraceLiveVsOffline traces a pod → service → remote endpoint first packet on a node with
// 200 pods and 1,000 services (6,000+ flows): through a real ovs-vswitchd (every ofproto/trace run
// Run needs, over unixctl) and with the offline evaluator over the same flows, in the same run. It
// prints both and their ratio; the machine is shared, so read the ratio, not the absolute times.
func BenchmarkTraceLiveVsOffline(b *testing.B) {
	br := ofbridge.New(b)
	ctx := context.Background()
	addPorts(b, br, map[string]uint32{pipeline.PortNameVXLAN: pipeline.PortVXLAN, pipeline.PortNameTun0: pipeline.PortTun0, "pa": 3})
	st := testState(pipeline.ModeMultitenant)
	for i := 0; i < 200; i++ {
		ip := netip.AddrFrom4([4]byte{10, 128, 1, byte(i)})
		st.Pods = append(st.Pods, pipeline.PodState{Namespace: "bench", Name: fmt.Sprint("p", i), IP: ip, MAC: net.HardwareAddr(mac(ip)),
			OFPort: uint32(100 + i), VNID: 11})
	}
	for i := 0; i < 1000; i++ {
		st.Services = append(st.Services, pipeline.ServiceState{Namespace: "bench", Name: fmt.Sprint("s", i),
			ClusterIP: netip.AddrFrom4([4]byte{172, 30, byte(1 + i/250), byte(i % 250)}),
			Ports: []pipeline.ServicePort{{Protocol: openflow.IPProtoTCP, Port: 80, Endpoints: []pipeline.Endpoint{
				{IP: netip.AddrFrom4([4]byte{10, 128, 1, byte(i % 200)}), Port: 8080, Ready: true, Local: true},
				{IP: ipRemote, Port: 8080, Ready: true}}}}})
	}
	off := install(b, br, st)
	l := live{c: unixctl.New(br.Inst.Dir, "ovs-vswitchd"), bridge: "br0", last: new(string)}
	p := fromPod(3, ipA, netip.AddrFrom4([4]byte{172, 30, 3, 100}), "tcp", 80) // service 600
	choose := endpointChooser(off, ipRemote)
	timeRuns := func(t Tracer) (time.Duration, []string) {
		var key []string
		start := time.Now()
		for i := 0; i < b.N; i++ {
			path, _, err := Run(ctx, t, p, choose)
			if err != nil {
				b.Fatal(err)
			}
			key = path.Key()
		}
		return time.Since(start) / time.Duration(b.N), key
	}
	b.ResetTimer()
	liveTime, liveKey := timeRuns(l)
	offTime, offKey := timeRuns(Offline{off})
	b.StopTimer()
	if fmt.Sprint(liveKey) != fmt.Sprint(offKey) {
		b.Fatalf("paths differ:\n%v\n%v", liveKey, offKey)
	}
	b.ReportMetric(float64(liveTime.Microseconds()), "live-µs/trace")
	b.ReportMetric(float64(offTime.Microseconds()), "offline-µs/trace")
	b.ReportMetric(float64(liveTime)/float64(offTime), "live/offline")
	flows := 0
	for _, fs := range off.tables {
		flows += len(fs)
	}
	b.Logf("%d flows: live %s, offline %s per first-packet trace", flows, liveTime, offTime)
}
