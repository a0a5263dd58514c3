package pipeline

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	. "github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	"github.com/ofsdn/ofsdn/internal/fakeswitch"
	"github.com/ofsdn/ofsdn/internal/ofbridge"
)

// benchServices is a node with n services of one TCP port, each with eps endpoints spread over the
// cluster (a tenth of them local).
func benchServices(n, eps int) NodeState {
	s := svcNode()
	for i := 0; i < n; i++ {
		svc := ServiceState{Namespace: "bench", Name: fmt.Sprintf("svc%d", i),
			ClusterIP: netip.AddrFrom4([4]byte{172, 30, byte(i >> 8), byte(i)})}
		p := ServicePort{Name: "http", Protocol: IPProtoTCP, Port: 80, NodePort: uint16(30000 + i%2000)}
		for j := 0; j < eps; j++ {
			k := i*eps + j
			p.Endpoints = append(p.Endpoints, Endpoint{IP: netip.AddrFrom4([4]byte{10, 128 + byte(k>>16&3), byte(k >> 8), byte(k)}),
				Port: 8080, Ready: true, Serving: true, Local: j == 0})
		}
		svc.Ports = []ServicePort{p}
		s.Services = append(s.Services, svc)
	}
	return s
}

// BenchmarkServicesInstallOnOVS: 1,000 services × 10 endpoints on one node, rendered and installed
// into an empty bridge (target < 1 s), then one endpoint replaced (target < 10 ms, flow-mods
// proportional to the change). The change is timed whole (the agent renders the whole node) and
// without the render (set and sync of the one owner).
func BenchmarkServicesInstallOnOVS(b *testing.B) {
	const nSvc, nEps = 1000, 10
	br := ofbridge.New(b)
	ctx := context.Background()
	state := benchServices(nSvc, nEps)
	var full, change, render time.Duration
	var fullStats, changeStats reconcile.SyncStats
	var flowsPer, groupsPer float64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, cmd := range []string{"del-flows", "del-groups"} {
			if _, err := br.Inst.Ofctl(cmd, ofbridge.Name); err != nil {
				b.Fatal(err)
			}
		}
		start := time.Now()
		var renderer Renderer // as the agent keeps one
		owners, _, err := renderer.Render(state)
		if err != nil {
			b.Fatal(err)
		}
		r := newReconciler(br.Switch, 1)
		res, err := install(ctx, r, nil, owners)
		if err != nil {
			b.Fatal(err)
		}
		fullStats = res.Stats
		full += time.Since(start)
		nf, ng := 0, 0
		for o, st := range owners {
			if o.Category == reconcile.CategoryService {
				nf += len(st.Flows)
				ng += len(st.Groups)
			}
		}
		flowsPer, groupsPer = float64(nf)/nSvc, float64(ng)/nSvc

		// One endpoint of one service is replaced: render the node (as the agent does: the Renderer
		// renders only the changed service again), set and sync the one owner whose state changed.
		changed := state
		changed.Services = append([]ServiceState(nil), state.Services...)
		svc := changed.Services[nSvc/2]
		svc.Ports = []ServicePort{svc.Ports[0]}
		svc.Ports[0].Endpoints = append([]Endpoint(nil), svc.Ports[0].Endpoints...)
		svc.Ports[0].Endpoints[3].IP = netip.MustParseAddr("10.131.255.1")
		changed.Services[nSvc/2] = svc
		start = time.Now()
		owners, _, err = renderer.Render(changed)
		if err != nil {
			b.Fatal(err)
		}
		render += time.Since(start)
		o := ServicePortOwner(svc, svc.Ports[0])
		st := owners[o]
		res, err = r.Apply(ctx, map[reconcile.Owner]*reconcile.OwnerState{o: &st})
		if err != nil || len(res.Failed) > 0 {
			b.Fatal(err, res.Failed)
		}
		changeStats = res.Stats
		change += time.Since(start)
	}
	b.ReportMetric(float64(full.Milliseconds())/float64(b.N), "ms/full-install")
	b.ReportMetric(float64(change.Microseconds())/float64(b.N)/1000, "ms/endpoint-change")
	b.ReportMetric(float64((change-render).Microseconds())/float64(b.N)/1000, "ms/endpoint-change-sync")
	b.ReportMetric(float64(render.Microseconds())/float64(b.N)/1000, "ms/render-node")
	b.ReportMetric(float64(changeStats.Changes()), "mods/endpoint-change")
	b.ReportMetric(flowsPer, "flows/service")
	b.ReportMetric(groupsPer, "groups/service")
	b.Logf("full install: %s; one endpoint replaced: %s", fullStats, changeStats)
}

// BenchmarkServiceEndpointChangeMods: how many flow-mods and group-mods one endpoint change costs a
// service port, plain (select group) and with sessionAffinity ClientIP, TCP and UDP, for 3, 10 and 100
// endpoints. Each iteration replays the same 200 changes (a seeded mix of an endpoint added, one
// removed, one replaced) against an in-memory switch through the Reconciler, as the agent applies
// them; the figures are mods per change, and affinity's ratio to the plain service of the same size.
func BenchmarkServiceEndpointChangeMods(b *testing.B) {
	type kind struct {
		name     string
		proto    uint8
		affinity uint32
	}
	kinds := []kind{{"plain-tcp", IPProtoTCP, 0}, {"plain-udp", IPProtoUDP, 0}, {"affinity-tcp", IPProtoTCP, 10800}}
	const changes = 200
	for _, n := range []int{3, 10, 100} {
		perKind := map[string]float64{}
		for _, k := range kinds {
			var mods int
			for i := 0; i < b.N; i++ {
				mods = replayEndpointChanges(b, n, k.proto, k.affinity, changes)
			}
			perKind[k.name] = float64(mods) / changes
			b.ReportMetric(perKind[k.name], fmt.Sprintf("mods/change-%s-%d", k.name, n))
		}
		b.ReportMetric(perKind["affinity-tcp"]/perKind["plain-tcp"], fmt.Sprintf("affinity/plain-%d", n))
	}
}

// replayEndpointChanges installs one service port with n endpoints, then applies changes endpoint
// changes (seeded, so every run and every code version replays the same ones) and returns the mods
// they cost in total.
func replayEndpointChanges(b *testing.B, n int, proto uint8, affinity uint32, changes int) int {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(uint64(n), uint64(proto)))
	next := 0
	newEndpoint := func() Endpoint {
		next++
		return Endpoint{IP: netip.AddrFrom4([4]byte{10, 128 + byte(rng.IntN(4)), byte(rng.IntN(256)), byte(1 + rng.IntN(254))}),
			Port: 8080, Ready: true, Serving: true, Local: next%10 == 0}
	}
	svc := ServiceState{Namespace: "bench", Name: "svc", ClusterIP: netip.MustParseAddr("172.30.0.10"), AffinityTimeout: affinity,
		Ports: []ServicePort{{Name: "p", Protocol: proto, Port: 80, NodePort: 30080}}}
	for len(svc.Ports[0].Endpoints) < n {
		svc.Ports[0].Endpoints = append(svc.Ports[0].Endpoints, newEndpoint())
	}
	var renderer Renderer
	r := newReconciler(fakeswitch.New(), 1)
	owners, _, err := renderer.Render(svcNode(svc))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := install(ctx, r, nil, owners); err != nil {
		b.Fatal(err)
	}
	o := ServicePortOwner(svc, svc.Ports[0])
	mods := 0
	for c := 0; c < changes; c++ {
		eps := slices.Clone(svc.Ports[0].Endpoints)
		switch i := rng.IntN(len(eps)); {
		case c%3 == 0 || len(eps) < n: // one more
			eps = append(eps, newEndpoint())
		case c%3 == 1: // one gone
			eps = slices.Delete(eps, i, i+1)
		default: // one replaced (a rolling update)
			eps[i] = newEndpoint()
		}
		svc.Ports = []ServicePort{svc.Ports[0]}
		svc.Ports[0].Endpoints = eps
		owners, _, err := renderer.Render(svcNode(svc))
		if err != nil {
			b.Fatal(err)
		}
		st := owners[o]
		res, err := r.Apply(ctx, map[reconcile.Owner]*reconcile.OwnerState{o: &st})
		if err != nil || len(res.Failed) > 0 {
			b.Fatal(err, res.Failed)
		}
		mods += res.Stats.Changes()
	}
	return mods
}
