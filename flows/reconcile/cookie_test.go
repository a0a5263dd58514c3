package reconcile

import (
	"hash/fnv"
	"strconv"
	"strings"
	"testing"
)

// Every category of the registry has its own number and name, and reads back from both; what is not
// a category is refused with the list of names.
func TestCategoriesRoundTrip(t *testing.T) {
	seen := map[string]Category{}
	all := Categories()
	for i, c := range all {
		if i > 0 && c <= all[i-1] {
			t.Errorf("categories out of order at %d", c)
		}
		name := c.String()
		if other, dup := seen[name]; dup || strings.HasPrefix(name, "category(") {
			t.Errorf("category %d is named %q (also %d)", c, name, other)
		}
		seen[name] = c
		for _, s := range []string{name, strconv.Itoa(int(c))} {
			if got, err := ParseCategory(s); err != nil || got != c {
				t.Errorf("ParseCategory(%q) = %v, %v; want %v", s, got, err, c)
			}
		}
	}
	if _, ok := seen["hostport"]; ok {
		t.Error("the retired category hostport is still registered")
	}
	_, err := ParseCategory("hostport")
	if err == nil || !strings.Contains(err.Error(), "pod, node, vnid, svc, netpol") {
		t.Errorf("ParseCategory(hostport): %v, want an error listing the categories", err)
	}
}

// Owner hashes are in every installed cookie: computing them without building the key must give
// FNV-1a of the key, bit for bit, or a restarted agent would not recognise its own flows.
func TestOwnerHashIsFNVOfTheKey(t *testing.T) {
	for _, o := range []Owner{
		{CategoryPipeline, "base"}, {CategoryPod, "blue/web-0"}, {CategoryService, "blue/dns:53/udp"},
		{CategoryNetPol, "ns/ünïcode"}, {CategoryTest, ""}, {Category(77), "x"},
	} {
		h := fnv.New32a()
		_, _ = h.Write([]byte(o.String()))
		if got, want := o.Hash(), h.Sum32(); got != want {
			t.Errorf("%s: hash %#x, want %#x", o, got, want)
		}
	}
}

// Owners sort by key without building it.
func TestCompareOwnersIsKeyOrder(t *testing.T) {
	owners := []Owner{{CategoryPod, "b/x"}, {CategoryPipeline, "services"}, {CategoryPod, "a/y"}, {CategoryNode, "n2"},
		{CategoryNetPol, "a/p"}, {CategoryService, "a/s:80/tcp"}, {CategoryTenant, "12"}, {CategoryLearned, "z"}, {CategoryTest, "t"}}
	for _, a := range owners {
		for _, b := range owners {
			if got, want := compareOwners(a, b), strings.Compare(a.String(), b.String()); got != want {
				t.Errorf("compareOwners(%s, %s) = %d, want %d", a, b, got, want)
			}
		}
	}
}
