package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func alloc(id string) Allocation {
	return Allocation{ContainerID: id, IfName: "eth0", PodNamespace: "ns", PodName: "p-" + id}
}

func TestAllocateReleaseExhaust(t *testing.T) {
	dir := t.TempDir()
	s, _, err := Open(dir, netip.MustParsePrefix("10.128.0.0/29"))
	if err != nil {
		t.Fatal(err)
	}
	// /29: .0 network, .1 gateway, .7 broadcast → .2-.6 usable.
	var got []netip.Addr
	for i := 0; i < 5; i++ {
		ip, err := s.Allocate(alloc(fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ip)
	}
	if got[0].String() != "10.128.0.2" || got[4].String() != "10.128.0.6" {
		t.Fatalf("allocated %v", got)
	}
	again, _ := s.Allocate(alloc("3"))
	if again != got[3] {
		t.Fatalf("same sandbox got another address: %s vs %s", again, got[3])
	}
	if _, err := s.Allocate(alloc("x")); !errors.Is(err, ErrExhausted) {
		t.Fatalf("want exhaustion, got %v", err)
	}
	if ip, err := s.Release("1", "eth0"); err != nil || ip != got[1] {
		t.Fatalf("release: %s %v", ip, err)
	}
	if ip, err := s.Release("1", "eth0"); err != nil || ip.IsValid() {
		t.Fatalf("second release must be a no-op: %s %v", ip, err)
	}
	ip, err := s.Allocate(alloc("y"))
	if err != nil || ip != got[1] {
		t.Fatalf("freed address not reusable: %s %v", ip, err)
	}
	if _, err := s.Allocate(Allocation{IfName: "eth0"}); err == nil {
		t.Fatal("allocation without container ID accepted")
	}
}

// TestCrashSafeReopen: what one store reserved, a store reopened on the same directory (an agent that
// crashed and restarted) knows; an interrupted write and a corrupt file are cleaned, never reused blindly.
func TestCrashSafeReopen(t *testing.T) {
	dir := t.TempDir()
	subnet := netip.MustParsePrefix("10.128.2.0/24")
	s1, _, err := Open(dir, subnet)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := s1.Allocate(alloc("a"))
	b, _ := s1.Allocate(alloc("b"))
	if err := os.WriteFile(filepath.Join(dir, ".tmp-12345"), []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "10.128.2.77"), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "10.9.9.9"), []byte("c\neth0\nns\np\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s2, dropped, err := Open(dir, subnet)
	if err != nil {
		t.Fatal(err)
	}
	if len(dropped) != 2 {
		t.Errorf("dropped %v, want the corrupt and the out-of-subnet reservation", dropped)
	}
	if got, ok := s2.Lookup("a", "eth0"); !ok || got.IP != a || got.PodName != "p-a" {
		t.Fatalf("reopened store lost a: %+v", got)
	}
	c, err := s2.Allocate(alloc("c"))
	if err != nil || c == a || c == b {
		t.Fatalf("reopened store reused an address: %s (a=%s b=%s) %v", c, a, b, err)
	}
	if _, err := os.Stat(filepath.Join(dir, ".tmp-12345")); !os.IsNotExist(err) {
		t.Error("interrupted reservation left behind")
	}
	released, err := s2.GC(func(al Allocation) bool { return al.ContainerID == "a" })
	if err != nil || len(released) != 2 {
		t.Fatalf("GC released %v, %v", released, err)
	}
	if len(s2.List()) != 1 {
		t.Fatalf("after GC: %v", s2.List())
	}
}

func TestConcurrentAllocationsDistinct(t *testing.T) {
	s, _, err := Open(t.TempDir(), netip.MustParsePrefix("10.128.0.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[netip.Addr]string{}
	var wg sync.WaitGroup
	for i := 0; i < 30; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			ip, err := s.Allocate(alloc(fmt.Sprint(i)))
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if prev, dup := seen[ip]; dup {
				t.Errorf("%s given to %s and %d", ip, prev, i)
			}
			seen[ip] = fmt.Sprint(i)
		}(i)
	}
	wg.Wait()
}

func TestOpenRejectsBadSubnet(t *testing.T) {
	for _, p := range []string{"10.0.0.0/31", "fd00::/64"} {
		if _, _, err := Open(t.TempDir(), netip.MustParsePrefix(p)); err == nil {
			t.Errorf("Open(%s) accepted", p)
		}
	}
}

// TestAllocateIP: a requested address is reserved when usable and free, survives a reopen, is refused
// (naming its holder) when taken, and is skipped by dynamic allocation.
func TestAllocateIP(t *testing.T) {
	dir := t.TempDir()
	s, _, err := Open(dir, netip.MustParsePrefix("10.200.1.0/29"))
	if err != nil {
		t.Fatal(err)
	}
	ip := netip.MustParseAddr("10.200.1.2")
	if err := s.AllocateIP(alloc("a"), ip); err != nil {
		t.Fatal(err)
	}
	if err := s.AllocateIP(alloc("a"), ip); err != nil {
		t.Fatalf("the same request again: %v", err)
	}
	for _, tc := range []struct {
		who  string
		ip   string
		want error
	}{
		{"b", "10.200.1.2", ErrInUse},
		{"b", "10.200.1.0", ErrNotUsable}, // network
		{"b", "10.200.1.1", ErrNotUsable}, // gateway
		{"b", "10.200.1.7", ErrNotUsable}, // broadcast
		{"b", "10.200.2.2", ErrNotUsable}, // outside
		{"a", "10.200.1.3", nil},          // holds .2 already: an error, but neither of the two
	} {
		err := s.AllocateIP(alloc(tc.who), netip.MustParseAddr(tc.ip))
		if tc.want == nil {
			if err == nil || errors.Is(err, ErrInUse) || errors.Is(err, ErrNotUsable) {
				t.Errorf("%s asks %s: %v, want a plain refusal", tc.who, tc.ip, err)
			}
			continue
		}
		if !errors.Is(err, tc.want) {
			t.Errorf("%s asks %s: %v, want %v", tc.who, tc.ip, err, tc.want)
		}
	}
	if err := s.AllocateIP(alloc("b"), ip); err == nil || !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "ns/p-a") {
		t.Errorf("a taken address names its holder: %v", err)
	}
	got, err := s.Allocate(alloc("c"))
	if err != nil || got == ip {
		t.Fatalf("dynamic allocation gave %s (%v), the static address is %s", got, err, ip)
	}
	s2, _, err := Open(dir, netip.MustParsePrefix("10.200.1.0/29"))
	if err != nil {
		t.Fatal(err)
	}
	if a, ok := s2.Lookup("a", "eth0"); !ok || a.IP != ip {
		t.Fatalf("after reopening: %+v %v", a, ok)
	}
}
