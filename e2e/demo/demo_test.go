package demo

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/ofsdn/ofsdn/e2e/lab"
	"github.com/ofsdn/ofsdn/flows"
)

// TestDemoMatrix: pods of two tenants and the global namespace on two OVS nodes, connected through
// VXLAN by Render's flows over ofsdn's session: multitenant isolates the tenants across nodes while
// VNID 0 reaches everyone; subnet mode is flat.
func TestDemoMatrix(t *testing.T) {
	if testing.Short() || os.Geteuid() != 0 {
		t.Skip("needs root and real OVS")
	}
	lab.Require(t)
	for _, mode := range []flows.Mode{flows.ModeMultitenant, flows.ModeSubnet} {
		t.Run(string(mode), func(t *testing.T) {
			var out bytes.Buffer
			res, err := Run(context.Background(), &out, Options{Nodes: 2, Mode: mode})
			if err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			if bad := res.Mismatches(); len(bad) > 0 {
				t.Fatalf("connectivity not as expected:\n%s\n%s", strings.Join(bad, "\n"), out.String())
			}
			if len(res.Pods) != 6 || !strings.Contains(out.String(), "table 80 ingress-isolation") {
				t.Fatalf("demo output:\n%s", out.String())
			}
		})
	}
}
