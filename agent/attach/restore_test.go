package attach

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/agent/ipam"
	"github.com/ofsdn/ofsdn/agent/podnet"
	"github.com/ofsdn/ofsdn/cni"
	"github.com/ofsdn/ofsdn/ovsdb"
)

func portFor(pod, uid string, ofport int, attached time.Time) *ovsdb.PortInfo {
	ids := map[string]string{ExtPodNamespace: "ns", ExtPodName: pod, ExtPodUID: uid, ExtMAC: "0a:58:0a:80:00:05", ExtNetNS: "/var/run/netns/x"}
	if !attached.IsZero() {
		ids[ExtAttached] = attached.Format(time.RFC3339Nano)
	}
	return &ovsdb.PortInfo{Name: "veth0", OFPort: ofport, ExternalIDs: ids}
}

func TestLocalDecision(t *testing.T) {
	alloc := &ipam.Allocation{ContainerID: "c", IfName: "eth0"}
	port := portFor("web", "u", 5, time.Time{})
	noMAC := portFor("web", "u", 5, time.Time{})
	delete(noMAC.ExternalIDs, ExtMAC)
	for _, tc := range []struct {
		name string
		f    restoredFacts
		want verdict
	}{
		{"attached", restoredFacts{Port: port, Alloc: alloc}, keep},
		{"DEL left while the agent was away", restoredFacts{Port: port, Alloc: alloc, PendingDelete: &cni.PendingDelete{}}, release},
		{"reservation without port", restoredFacts{Alloc: alloc}, release},
		{"veth alone", restoredFacts{}, release},
		{"port without reservation", restoredFacts{Port: port}, release},
		{"port OVS cannot open", restoredFacts{Port: &ovsdb.PortInfo{OFPort: -1, Error: "could not open network device", ExternalIDs: port.ExternalIDs}, Alloc: alloc}, release},
		{"port not yet numbered", restoredFacts{Port: portFor("web", "u", 0, time.Time{}), Alloc: alloc}, release},
		{"port without MAC", restoredFacts{Port: noMAC, Alloc: alloc}, release},
		{"netns gone", restoredFacts{Port: port, Alloc: alloc, Plumbing: fmt.Errorf("x: %w", podnet.ErrNetNSGone)}, release},
		{"netns holds another sandbox", restoredFacts{Port: port, Alloc: alloc, Plumbing: fmt.Errorf("x: %w", podnet.ErrNotAttached)}, release},
		// Anything else proves nothing: the pod may well be alive.
		{"interface altered", restoredFacts{Port: port, Alloc: alloc, Plumbing: errors.New("eth0 lacks address 10.128.0.5/23")}, keep},
		{"kernel could not be asked", restoredFacts{Port: port, Alloc: alloc, Plumbing: errors.New("netlink: too many open files")}, keep},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if d := localDecision(tc.f); d.verdict != tc.want {
				t.Errorf("%s, want verdict %d", d, tc.want)
			}
		})
	}
}

func TestAPIDecision(t *testing.T) {
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	rec := recorded{Namespace: "ns", Name: "web", UID: "u1", Attached: now.Add(-time.Hour)}
	recent := recorded{Namespace: "ns", Name: "web", UID: "u1", Attached: now.Add(-10 * time.Second)}
	legacy := recorded{Namespace: "ns", Name: "web"} // attached before the UID and time were recorded
	for _, tc := range []struct {
		name string
		rec  recorded
		p    PodPresence
		want verdict
	}{
		{"pod exists", rec, PodPresence{Found: true, UID: "u1", NodeName: "n1"}, keep},
		{"pod gone", rec, PodPresence{}, release},
		{"pod gone, attached before times were recorded", legacy, PodPresence{}, release},
		{"pod created again", rec, PodPresence{Found: true, UID: "u2", NodeName: "n1"}, release},
		{"pod on another node", rec, PodPresence{Found: true, UID: "u1", NodeName: "n2"}, release},
		{"no UID recorded", legacy, PodPresence{Found: true, UID: "u2", NodeName: "n1"}, keep},
		// A static pod: kubelet gave CNI its UID, the mirror in the API has its own.
		{"static pod's mirror", rec, PodPresence{Found: true, UID: "m9", MirrorOf: "u1", NodeName: "n1"}, keep},
		{"another static pod's mirror", rec, PodPresence{Found: true, UID: "m9", MirrorOf: "u7", NodeName: "n1"}, release},
		// Not yet in the API (a mirror is created after its static pod runs): asked again later.
		{"pod missing right after its ADD", recent, PodPresence{}, undecided},
		// Never on an API error: the pod may exist.
		{"API server down", rec, PodPresence{Err: errors.New("connection refused")}, undecided},
		{"API server forbids", rec, PodPresence{Err: errors.New("forbidden")}, undecided},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if d := apiDecision(tc.rec, "n1", tc.p, now, DefaultAbsentPodGrace); d.verdict != tc.want {
				t.Errorf("%s, want verdict %d", d, tc.want)
			}
		})
	}
}

func TestSupersede(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name     string
		attached map[string]time.Time // sandbox → when attached (zero: not recorded), all of pod ns/web
		pending  map[string]verdict   // verdicts before supersede (default keep)
		released []string
	}{
		{"one sandbox", map[string]time.Time{"a": t0}, nil, nil},
		{"older goes", map[string]time.Time{"a": t0, "b": t0.Add(time.Second)}, nil, []string{"a"}},
		{"two older go", map[string]time.Time{"a": t0, "b": t0.Add(time.Second), "c": t0.Add(time.Minute)}, nil, []string{"a", "b"}},
		{"undecided older goes too", map[string]time.Time{"a": t0, "b": t0.Add(time.Second)}, map[string]verdict{"a": undecided}, []string{"a"}},
		{"released newer does not count", map[string]time.Time{"a": t0, "b": t0.Add(time.Second)}, map[string]verdict{"b": release}, []string{"b"}},
		{"order unknown: both stay", map[string]time.Time{"a": {}, "b": {}}, nil, nil},
		{"unrecorded is not older", map[string]time.Time{"a": {}, "b": t0}, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			facts := map[attachment]*restoredFacts{}
			decisions := map[attachment]decision{}
			for s, at := range tc.attached {
				a := attachment{s, "eth0"}
				facts[a] = &restoredFacts{attachment: a, Port: portFor("web", "u", 5, at)}
				decisions[a] = decision{verdict: keep}
				if v, ok := tc.pending[s]; ok {
					decisions[a] = decision{verdict: v}
				}
			}
			supersede(facts, decisions)
			want := map[string]bool{}
			for _, s := range tc.released {
				want[s] = true
			}
			for a, d := range decisions {
				if (d.verdict == release) != want[a.ContainerID] {
					t.Errorf("%s: %s", a.ContainerID, d)
				}
			}
		})
	}
}
