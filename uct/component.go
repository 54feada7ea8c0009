package uct

import (
	"fmt"
	"sort"
	"sync"
)

// Component is a transport family (ib, shm, self, tcp), registered at init.
type Component interface {
	// Name is the component name ("ib", "shm", "self", "tcp").
	Name() string
	// MDResources lists the memory domains this component can open on this
	// host. It returns an error wrapping ErrUnavailable, with the reason
	// ("libibverbs not found", "no active port"), when there are none.
	MDResources() ([]MDResource, error)
	// OpenMD opens a memory domain by resource name.
	OpenMD(name string, cfg *Config) (MD, error)
}

// MDResource names a memory domain a component can open ("rxe0", "posix", "self", "tcp").
type MDResource struct {
	Name string
}

var (
	regMu      sync.RWMutex
	components = map[string]Component{}
)

// Register makes a component available. It panics on a duplicate name (a
// programming error at init, as database/sql.Register).
func Register(c Component) {
	regMu.Lock()
	defer regMu.Unlock()
	if _, dup := components[c.Name()]; dup {
		panic(fmt.Sprintf("uct: component %q registered twice", c.Name()))
	}
	components[c.Name()] = c
}

// ComponentInfo is a registered component with its resources or the reason it is unavailable.
type ComponentInfo struct {
	Component Component
	Resources []MDResource
	Err       error // non-nil: the component is unavailable, and why
}

// Components returns every registered component, sorted by name, each with its
// MD resources or the reason it is unavailable.
func Components() []ComponentInfo {
	regMu.RLock()
	cs := make([]Component, 0, len(components))
	for _, c := range components {
		cs = append(cs, c)
	}
	regMu.RUnlock()
	sort.Slice(cs, func(i, j int) bool { return cs[i].Name() < cs[j].Name() })
	out := make([]ComponentInfo, 0, len(cs))
	for _, c := range cs {
		r, err := c.MDResources()
		out = append(out, ComponentInfo{Component: c, Resources: r, Err: err})
	}
	return out
}

// LookupComponent returns the registered component with that name.
func LookupComponent(name string) (Component, bool) {
	regMu.RLock()
	defer regMu.RUnlock()
	c, ok := components[name]
	return c, ok
}
