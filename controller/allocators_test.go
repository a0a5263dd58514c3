package controller

import (
	"errors"
	"net/netip"
	"testing"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
)

func prefixes(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, x := range s {
		out = append(out, netip.MustParsePrefix(x))
	}
	return out
}

func TestSubnetAllocator(t *testing.T) {
	tests := []struct {
		name     string
		cidrs    []netip.Prefix
		hostBits int
		total    int64
		first    []string
	}{
		{"one /24 in /26s", prefixes("10.0.0.0/24"), 6, 4, []string{"10.0.0.0/26", "10.0.0.64/26", "10.0.0.128/26", "10.0.0.192/26"}},
		{"two CIDRs in order", prefixes("10.0.0.0/25", "10.1.0.0/25"), 6, 4, []string{"10.0.0.0/26", "10.0.0.64/26", "10.1.0.0/26", "10.1.0.64/26"}},
		{"openshift default", prefixes("10.128.0.0/14"), 9, 512, []string{"10.128.0.0/23", "10.128.2.0/23"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, err := NewSubnetAllocator(tc.cidrs, tc.hostBits)
			if err != nil {
				t.Fatal(err)
			}
			if a.Total() != tc.total {
				t.Fatalf("total %d, want %d", a.Total(), tc.total)
			}
			for i, want := range tc.first {
				got, err := a.Allocate()
				if err != nil || got.String() != want {
					t.Fatalf("allocation %d: %v %v, want %s", i, got, err, want)
				}
			}
		})
	}
}

func TestSubnetAllocatorExhaustionReleaseRebuild(t *testing.T) {
	a, _ := NewSubnetAllocator(prefixes("10.0.0.0/24"), 6)
	seen := map[netip.Prefix]bool{}
	for range 4 {
		p, err := a.Allocate()
		if err != nil || seen[p] {
			t.Fatalf("%v %v (dup %v)", p, err, seen[p])
		}
		seen[p] = true
	}
	if _, err := a.Allocate(); !errors.Is(err, ErrExhausted) {
		t.Fatalf("fifth: %v, want ErrExhausted", err)
	}
	a.Release(netip.MustParsePrefix("10.0.0.64/26"))
	if p, err := a.Allocate(); err != nil || p.String() != "10.0.0.64/26" {
		t.Fatalf("after release: %v %v", p, err)
	}
	// Rebuilt from what exists: duplicates and foreign subnets refused.
	b, _ := NewSubnetAllocator(prefixes("10.0.0.0/24"), 6)
	for _, tc := range []struct {
		p  string
		ok bool
	}{{"10.0.0.0/26", true}, {"10.0.0.0/26", false}, {"10.9.0.0/26", false}, {"10.0.0.0/25", false}, {"10.0.0.1/26", false}} {
		if err := b.MarkAllocated(netip.MustParsePrefix(tc.p)); (err == nil) != tc.ok {
			t.Errorf("MarkAllocated(%s): %v", tc.p, err)
		}
	}
	if p, _ := b.Allocate(); p.String() != "10.0.0.64/26" {
		t.Errorf("rebuilt allocator gave %s", p)
	}
	for _, bad := range []struct {
		cidrs []netip.Prefix
		bits  int
	}{{nil, 8}, {prefixes("10.0.0.0/24"), 9}, {prefixes("10.0.0.1/24"), 4}, {prefixes("fd00::/64"), 8}} {
		if _, err := NewSubnetAllocator(bad.cidrs, bad.bits); err == nil {
			t.Errorf("NewSubnetAllocator(%v, %d) accepted", bad.cidrs, bad.bits)
		}
	}
}

func TestVNIDAllocator(t *testing.T) {
	a := NewVNIDAllocator()
	if err := a.Use(12); err != nil {
		t.Fatal(err)
	}
	got := map[uint32]bool{}
	for range 5 {
		id, err := a.Allocate()
		if err != nil || id < networkv1.MinVNID || id == 12 || got[id] {
			t.Fatalf("Allocate: %d %v", id, err)
		}
		got[id] = true
	}
	// Shared VNIDs are counted: freed only by the last user.
	if err := a.Use(10); err != nil {
		t.Fatal(err)
	}
	a.Release(10)
	if a.Users(10) != 1 {
		t.Fatalf("users of 10: %d", a.Users(10))
	}
	a.Release(10)
	if a.Users(10) != 0 {
		t.Fatalf("users of 10 after the last left: %d", a.Users(10))
	}
	for _, bad := range []uint32{1, 9, networkv1.MaxVNID + 1} {
		if err := a.Use(bad); err == nil {
			t.Errorf("Use(%d) accepted", bad)
		}
	}
	if err := a.Use(0); err != nil || a.Users(0) != 0 {
		t.Errorf("global VNID is not counted: %v %d", err, a.Users(0))
	}
}

// An allocator over Networks' VNIs accepts and hands out only those: a tenant's VNID is refused.
func TestVNIDAllocatorOfNetworks(t *testing.T) {
	a := newVNIDAllocator(networkv1.MinNetworkVNI, networkv1.MaxNetworkVNI)
	if id, err := a.Allocate(); err != nil || id != networkv1.MinNetworkVNI {
		t.Fatalf("Allocate: %d %v, want %d", id, err, networkv1.MinNetworkVNI)
	}
	if err := a.Use(networkv1.MaxNetworkVNI); err != nil {
		t.Error(err)
	}
	for _, bad := range []uint32{networkv1.MinVNID, networkv1.MaxVNID, networkv1.MaxNetworkVNI + 1} {
		if err := a.Use(bad); err == nil {
			t.Errorf("Use(%d) accepted", bad)
		}
	}
}

func TestValidateSpec(t *testing.T) {
	good := networkv1.ClusterNetworkSpec{ClusterCIDRs: []networkv1.CIDR{"10.128.0.0/14"}, HostSubnetLength: 9,
		ServiceNetwork: "172.30.0.0/16", PluginMode: networkv1.PluginModeMultitenant}
	tests := []struct {
		name string
		edit func(s *networkv1.ClusterNetworkSpec)
		ok   bool
	}{
		{"good", func(*networkv1.ClusterNetworkSpec) {}, true},
		{"service overlaps", func(s *networkv1.ClusterNetworkSpec) { s.ServiceNetwork = "10.130.0.0/16" }, false},
		{"host subnet too big", func(s *networkv1.ClusterNetworkSpec) { s.HostSubnetLength = 20 }, false},
		{"overlapping CIDRs", func(s *networkv1.ClusterNetworkSpec) { s.ClusterCIDRs = append(s.ClusterCIDRs, "10.129.0.0/16") }, false},
		{"two CIDRs", func(s *networkv1.ClusterNetworkSpec) { s.ClusterCIDRs = append(s.ClusterCIDRs, "10.200.0.0/16") }, true},
		{"host bits set", func(s *networkv1.ClusterNetworkSpec) { s.ClusterCIDRs = []networkv1.CIDR{"10.128.0.1/14"} }, false},
		{"mode", func(s *networkv1.ClusterNetworkSpec) { s.PluginMode = "flat" }, false},
		{"encapsulation none", func(s *networkv1.ClusterNetworkSpec) { s.Encapsulation = networkv1.EncapsulationNone }, true},
		{"encapsulation vxlan", func(s *networkv1.ClusterNetworkSpec) { s.Encapsulation = networkv1.EncapsulationVXLAN }, true},
		{"encapsulation unknown", func(s *networkv1.ClusterNetworkSpec) { s.Encapsulation = "geneve" }, false},
		{"encapsulation in capitals", func(s *networkv1.ClusterNetworkSpec) { s.Encapsulation = "VXLAN" }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := good
			s.ClusterCIDRs = append([]networkv1.CIDR(nil), good.ClusterCIDRs...)
			tc.edit(&s)
			if err := ValidateSpec(s); (err == nil) != tc.ok {
				t.Fatalf("ValidateSpec: %v", err)
			}
		})
	}
}
