package flows

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
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

// Category is the kind of object that owns a flow.
type Category uint8

const (
	CategoryNone     Category = iota
	CategoryPipeline          // table defaults and fixed plumbing
	CategoryPod               // one local pod
	CategoryNode              // one remote node (its subnet, tunnel)
	CategoryTenant            // one VNID (tenant isolation)
	CategoryService           // one service port
	CategoryNetPol            // one NetworkPolicy
	CategoryHostPort          // one pod's hostPort mappings
	CategoryTest              // flows that tests and benchmarks install
	// CategoryLearned marks flows the switch learns itself (sessionAffinity): no owner renders them, so
	// the Reconciler leaves them alone instead of deleting them as strays.
	CategoryLearned
)

var categoryNames = map[Category]string{
	CategoryNone: "none", CategoryPipeline: "pipeline", CategoryPod: "pod", CategoryNode: "node",
	CategoryTenant: "vnid", CategoryService: "svc", CategoryNetPol: "netpol", CategoryHostPort: "hostport",
	CategoryTest: "test", CategoryLearned: "learned",
}

func (c Category) String() string {
	if n, ok := categoryNames[c]; ok {
		return n
	}
	return fmt.Sprintf("category(%d)", uint8(c))
}

// ParseCategory reads a category name as printed by String.
func ParseCategory(s string) (Category, error) {
	for c, n := range categoryNames {
		if n == s {
			return c, nil
		}
	}
	if v, err := strconv.ParseUint(s, 0, 8); err == nil {
		return Category(v), nil
	}
	return 0, fmt.Errorf("unknown flow category %q", s)
}

// Owner names the object whose state a set of flows renders: "pod/ns/name", "node/n2", "vnid/42",
// "svc/ns/name:port", "netpol/ns/name", "pipeline/base". One owner's flows are synced together.
type Owner struct {
	Category Category
	Name     string
}

func (o Owner) String() string { return o.Category.String() + "/" + o.Name }

// Hash is the stable 32-bit owner hash carried in cookies (FNV-1a of the owner key).
func (o Owner) Hash() uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(o.String()))
	return h.Sum32()
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

// Owners of the common kinds.
var PipelineOwner = Owner{Category: CategoryPipeline, Name: "base"}

func PodOwner(namespace, name string) Owner { return Owner{CategoryPod, namespace + "/" + name} }
func NodeOwner(node string) Owner           { return Owner{CategoryNode, node} }
func TenantOwner(vnid uint32) Owner {
	return Owner{CategoryTenant, strconv.FormatUint(uint64(vnid), 10)}
}
func ServiceOwner(namespace, name, port string) Owner {
	return Owner{CategoryService, namespace + "/" + name + ":" + port}
}
func NetPolOwner(namespace, name string) Owner { return Owner{CategoryNetPol, namespace + "/" + name} }

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

// Save writes the index as JSON (owner keys) atomically, for flowctl to read.
func (x *OwnerIndex) Save(path string) error {
	x.mu.RLock()
	keys := make([]string, 0, len(x.owners))
	for _, list := range x.owners {
		for _, o := range list {
			keys = append(keys, o.String())
		}
	}
	x.mu.RUnlock()
	sort.Strings(keys)
	data, err := json.Marshal(struct {
		Owners []string `json:"owners"`
	}{keys})
	if err != nil {
		return fmt.Errorf("owner index: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("owner index: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("owner index: write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("owner index: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("owner index: %w", err)
	}
	return nil
}

// LoadOwnerIndex reads an index written by Save.
func LoadOwnerIndex(path string) (*OwnerIndex, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("owner index: %w", err)
	}
	var doc struct {
		Owners []string `json:"owners"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("owner index %s: %w", path, err)
	}
	x := NewOwnerIndex()
	for _, k := range doc.Owners {
		o, err := ParseOwner(k)
		if err != nil {
			return nil, fmt.Errorf("owner index %s: %w", path, err)
		}
		x.Add(o)
	}
	return x, nil
}
