package pipeline

import (
	"testing"

	"github.com/ofsdn/ofsdn/flows/reconcile"
)

// Every owner constructor's name reads back into the object it was built from, by ObjectOf and by the
// owner key a dump prints; owners of no API object read back as none.
func TestOwnersNameTheirObjects(t *testing.T) {
	cases := []struct {
		owner reconcile.Owner
		key   string
		want  Object
		ok    bool
	}{
		{PodOwner("blue", "web-0"), "pod/blue/web-0", Object{Kind: KindPod, Namespace: "blue", Name: "web-0"}, true},
		{NodeOwner("n2"), "node/n2", Object{Kind: KindNode, Name: "n2"}, true},
		{ServiceOwner("blue", "web", "http"), "svc/blue/web:http", Object{Kind: KindService, Namespace: "blue", Name: "web", Port: "http"}, true},
		{ServicePortOwner(ServiceState{Namespace: "blue", Name: "dns"}, ServicePort{Protocol: 17, Port: 53}), "svc/blue/dns:53/udp",
			Object{Kind: KindService, Namespace: "blue", Name: "dns", Port: "53/udp"}, true},
		{NetPolOwner("blue", "web-80"), "netpol/blue/web-80", Object{Kind: KindNetworkPolicy, Namespace: "blue", Name: "web-80"}, true},
		{AttachmentOwner("blue", "web-0", "net1"), "pod/blue/web-0@net1", Object{Kind: KindPod, Namespace: "blue", Name: "web-0", Interface: "net1"}, true},
		{NetworkOwner("red"), "net/red", Object{Kind: KindNetwork, Name: "red"}, true},
		{TenantOwner(12), "vnid/12", Object{}, false},
		{PipelineOwner, "pipeline/base", Object{}, false},
		{ServicesOwner, "pipeline/services", Object{}, false},
		{LocalOwner, "pipeline/local-subnet", Object{}, false},
		// Names no constructor builds.
		{reconcile.Owner{Category: reconcile.CategoryPod, Name: "no-namespace"}, "pod/no-namespace", Object{}, false},
		{reconcile.Owner{Category: reconcile.CategoryService, Name: "blue/web"}, "svc/blue/web", Object{}, false},
		{reconcile.Owner{Category: reconcile.CategoryNetPol, Name: "blue/a/b"}, "netpol/blue/a/b", Object{}, false},
		{reconcile.Owner{Category: reconcile.CategoryPod, Name: "blue/web@"}, "pod/blue/web@", Object{}, false},
		{reconcile.Owner{Category: reconcile.CategoryNetwork, Name: "a/b"}, "net/a/b", Object{}, false},
	}
	for _, tc := range cases {
		t.Run(tc.key, func(t *testing.T) {
			if got := tc.owner.String(); got != tc.key {
				t.Errorf("owner key %q, want %q", got, tc.key)
			}
			got, ok := ObjectOf(tc.owner)
			if ok != tc.ok || got != tc.want {
				t.Errorf("ObjectOf: %+v %v, want %+v %v", got, ok, tc.want, tc.ok)
			}
			if ok && got.Owner() != tc.owner {
				t.Errorf("ObjectOf: %+v builds owner %s back, want %s", got, got.Owner(), tc.owner)
			}
		})
	}
	for _, k := range []ObjectKind{KindPod, KindNode, KindService, KindNetworkPolicy, KindNetwork} {
		if k.APIVersion() == "" {
			t.Errorf("kind %s has no API version", k)
		}
	}
}
