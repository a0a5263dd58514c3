package reconcile

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// Cookie is a flow's 64-bit OpenFlow cookie: round:16 | category:8 | reserved:8 | owner:32.
//
// The round changes on every agent start, so the flows of a previous run can be deleted by cookie mask
// once the new run has installed its own. The category lets flowctl and drop counters say what kind of
// object a flow belongs to. The owner is a stable hash of the owner key; the OwnerIndex maps it back.
type Cookie uint64

const (
	cookieRoundShift    = 48
	cookieCategoryShift = 40
	// CookieRoundMask selects the round bits, for deleting a whole round by cookie mask.
	CookieRoundMask uint64 = 0xffff << cookieRoundShift
	// CookieIdentityMask selects category and owner: the same for an owner's flows in every round.
	CookieIdentityMask uint64 = 0xff<<cookieCategoryShift | 0xffffffff
)

// MakeCookie builds the cookie of an owner's flows in a round.
func MakeCookie(round uint16, o Owner) Cookie {
	return Cookie(uint64(round)<<cookieRoundShift | uint64(o.Category)<<cookieCategoryShift | uint64(o.Hash()))
}

func (c Cookie) Round() uint16      { return uint16(c >> cookieRoundShift) }
func (c Cookie) Category() Category { return Category(c >> cookieCategoryShift) }
func (c Cookie) OwnerHash() uint32  { return uint32(c) }
func (c Cookie) String() string     { return fmt.Sprintf("%#x", uint64(c)) }
func (c Cookie) identity() uint64   { return uint64(c) & CookieIdentityMask }

// Category is the kind of object that owns a flow. The numbers are in every installed cookie: never
// renumber one (a retired category leaves a gap).
type Category uint8

const (
	CategoryNone     Category = 0 // cookie 0: not installed by ofsdn
	CategoryPipeline Category = 1 // table defaults and fixed plumbing
	CategoryPod      Category = 2 // one local pod
	CategoryNode     Category = 3 // one remote node (its subnet, tunnel)
	CategoryTenant   Category = 4 // one VNID (tenant isolation)
	CategoryService  Category = 5 // one service port
	CategoryNetPol   Category = 6 // one NetworkPolicy
	// 7 was hostport: hostPorts are forwarded by the host (nf_tables), never rendered into flows.
	CategoryTest Category = 8 // flows that tests and benchmarks install
	// CategoryLearned marks flows the switch learns itself (sessionAffinity): no owner renders them, so
	// the Reconciler leaves them alone instead of deleting them as strays.
	CategoryLearned Category = 9
	// CategoryAdminPolicy is one ClusterNetworkPolicy (flows/pipeline/adminpolicy.go).
	CategoryAdminPolicy Category = 10
	// CategoryNetwork is one Network's own flows (flows/pipeline/networks.go); its pods' attachments
	// are CategoryPod ("pod/ns/name@net1").
	CategoryNetwork Category = 11
	// CategoryEgress is one namespace's egress classification and egress IPs; CategoryEgressFirewall
	// one EgressNetworkPolicy (flows/pipeline/egress.go). 20 and 21 leave 10-19 to other features
	// (11 is Networks').
	CategoryEgress         Category = 20
	CategoryEgressFirewall Category = 21
)

// categories is the registry of categories, by number: the name owner keys, dumps and metrics use.
// String, ParseCategory and Categories (flowctl's help) all read it.
var categories = []struct {
	c    Category
	name string
}{
	{CategoryNone, "none"}, {CategoryPipeline, "pipeline"}, {CategoryPod, "pod"}, {CategoryNode, "node"},
	{CategoryTenant, "vnid"}, {CategoryService, "svc"}, {CategoryNetPol, "netpol"},
	{CategoryTest, "test"}, {CategoryLearned, "learned"}, {CategoryAdminPolicy, "cnp"}, {CategoryNetwork, "net"},
	{CategoryEgress, "egress"}, {CategoryEgressFirewall, "egressfw"},
}

// Categories lists every category in use, by number.
func Categories() []Category {
	out := make([]Category, len(categories))
	for i, e := range categories {
		out[i] = e.c
	}
	return out
}

func (c Category) String() string {
	for _, e := range categories {
		if e.c == c {
			return e.name
		}
	}
	return fmt.Sprintf("category(%d)", uint8(c))
}

// ParseCategory reads a category name as printed by String, or a number.
func ParseCategory(s string) (Category, error) {
	for _, e := range categories {
		if e.name == s {
			return e.c, nil
		}
	}
	if v, err := strconv.ParseUint(s, 0, 8); err == nil {
		return Category(v), nil
	}
	names := make([]string, len(categories))
	for i, e := range categories {
		names[i] = e.name
	}
	return 0, fmt.Errorf("unknown flow category %q (a number, or one of %s)", s, strings.Join(names, ", "))
}

// Owner names the object whose state a set of flows renders: "pod/ns/name", "node/n2", "vnid/42",
// "svc/ns/name:port", "netpol/ns/name", "pipeline/base". One owner's flows are synced together.
type Owner struct {
	Category Category
	Name     string
}

func (o Owner) String() string { return o.Category.String() + "/" + o.Name }

// Hash is the stable 32-bit owner hash carried in cookies: FNV-1a of the owner key (String), computed
// without building the key (every new owner of an install hashes).
func (o Owner) Hash() uint32 {
	h := fnvAdd(fnvOffset32, o.Category.String())
	h = (h ^ '/') * fnvPrime32
	return fnvAdd(h, o.Name)
}

// FNV-1a, 32 bits (hash/fnv's constants).
const (
	fnvOffset32 uint32 = 2166136261
	fnvPrime32  uint32 = 16777619
)

func fnvAdd(h uint32, s string) uint32 {
	for i := 0; i < len(s); i++ {
		h = (h ^ uint32(s[i])) * fnvPrime32
	}
	return h
}

// ParseOwner reads an owner key as printed by String.
func ParseOwner(s string) (Owner, error) {
	cat, name, ok := strings.Cut(s, "/")
	if !ok || name == "" {
		return Owner{}, fmt.Errorf("owner %q: want category/name", s)
	}
	c, err := ParseCategory(cat)
	if err != nil {
		return Owner{}, err
	}
	return Owner{Category: c, Name: name}, nil
}

// LearnedCookie is the cookie of flows a switch learns on behalf of an owner (learn actions): category
// learned, no round. The reconciler never touches them; they expire, or go with the flow that learned them.
func LearnedCookie(o Owner) uint64 {
	return uint64(CategoryLearned)<<cookieCategoryShift | uint64(o.Hash())
}

// OwnerIndex maps cookie owner hashes back to owners, so dumps can name every flow's owner. Two owners
// with one hash are both kept: a collision is shown, never silently resolved.
type OwnerIndex struct {
	mu     sync.RWMutex
	owners map[uint32][]Owner
}

func NewOwnerIndex() *OwnerIndex { return &OwnerIndex{owners: make(map[uint32][]Owner)} }

// Add records an owner and reports whether its hash collides with a different owner's.
func (x *OwnerIndex) Add(o Owner) (collision bool) {
	h := o.Hash()
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, e := range x.owners[h] {
		if e == o {
			return len(x.owners[h]) > 1
		}
	}
	x.owners[h] = append(x.owners[h], o)
	return len(x.owners[h]) > 1
}

// Remove forgets an owner.
func (x *OwnerIndex) Remove(o Owner) {
	h := o.Hash()
	x.mu.Lock()
	defer x.mu.Unlock()
	list := x.owners[h]
	for i, e := range list {
		if e == o {
			list = append(list[:i:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(x.owners, h)
	} else {
		x.owners[h] = list
	}
}

// Lookup returns the owners known for a cookie's owner hash within its category.
func (x *OwnerIndex) Lookup(c Cookie) []Owner {
	x.mu.RLock()
	defer x.mu.RUnlock()
	var out []Owner
	for _, o := range x.owners[c.OwnerHash()] {
		if o.Category == c.Category() {
			out = append(out, o)
		}
	}
	return out
}

// Name returns a printable owner for a cookie: the owner key, "a|b" on a collision, or the hash.
func (x *OwnerIndex) Name(c Cookie) string {
	if x != nil {
		if os := x.Lookup(c); len(os) > 0 {
			names := make([]string, len(os))
			for i, o := range os {
				names[i] = o.String()
			}
			return strings.Join(names, "|")
		}
	}
	return fmt.Sprintf("%s/#%08x", c.Category(), c.OwnerHash())
}

// Keys lists the index's owner keys, sorted.
func (x *OwnerIndex) Keys() []string {
	x.mu.RLock()
	keys := make([]string, 0, len(x.owners))
	for _, list := range x.owners {
		for _, o := range list {
			keys = append(keys, o.String())
		}
	}
	x.mu.RUnlock()
	sort.Strings(keys)
	return keys
}

// MarshalJSON writes the index as its owner keys, sorted (what the agent saves for flowctl).
func (x *OwnerIndex) MarshalJSON() ([]byte, error) {
	return json.Marshal(ownerIndexDoc{Owners: x.Keys()})
}

type ownerIndexDoc struct {
	Owners []string `json:"owners"`
}

// ParseOwnerIndex reads an index written by MarshalJSON.
func ParseOwnerIndex(data []byte) (*OwnerIndex, error) {
	var doc ownerIndexDoc
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("owner index: %w", err)
	}
	x := NewOwnerIndex()
	for _, k := range doc.Owners {
		o, err := ParseOwner(k)
		if err != nil {
			return nil, fmt.Errorf("owner index: %w", err)
		}
		x.Add(o)
	}
	return x, nil
}

// compareOwners orders owners by key (String) without building the keys: category names hold only
// letters, so comparing the category's name, then the name, is comparing the keys.
func compareOwners(a, b Owner) int {
	if a.Category != b.Category {
		return strings.Compare(a.Category.String(), b.Category.String())
	}
	return strings.Compare(a.Name, b.Name)
}

// SortedOwnerKeys lists a map's owners in a stable order (by key), for logs, errors and golden files.
func SortedOwnerKeys[V any](m map[Owner]V) []Owner {
	out := make([]Owner, 0, len(m))
	for o := range m {
		out = append(out, o)
	}
	slices.SortFunc(out, compareOwners)
	return out
}
