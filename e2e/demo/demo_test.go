package demo

import (
	"bytes"
	"strings"
	"testing"

	"github.com/ofsdn/ofsdn/lab"
	"github.com/ofsdn/ofsdn/lab/kubelab"
)

// TestDemo runs make demo's whole path: the 3-node cluster, two tenants and default, the matrix as
// multitenant mode promises, and a flowctl dump of the isolation table.
func TestDemo(t *testing.T) {
	lab.Require(t)
	if _, err := kubelab.BinDir(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	res, err := Run(t.Context(), &out, Options{})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if bad := res.Mismatches(); len(bad) > 0 {
		t.Fatalf("connectivity not as expected:\n%s\n%s", strings.Join(bad, "\n"), out.String())
	}
	if len(res.Pods) != 9 || !strings.Contains(out.String(), "table 80 ingress-isolation") {
		t.Fatalf("demo output:\n%s", out.String())
	}
	if res.NetIDs["default"] != 0 || res.NetIDs["blue"] == res.NetIDs["red"] {
		t.Fatalf("NETIDs %v", res.NetIDs)
	}
}
