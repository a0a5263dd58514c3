package reconcile

import (
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
