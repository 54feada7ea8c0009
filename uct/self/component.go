// Package self is the in-process loopback transport (UCX uct/sm/self):
// active messages are copied into the target iface's bounded receive queue
// and delivered by its worker; RMA is a direct copy. Import it for its side
// effect of registering the "self" component.
package self

import (
	"fmt"

	"github.com/gouct/gouct/uct"
)

const (
	componentName = "self"
	tlName        = "self"
	deviceName    = "memory"
)

type component struct{}

func init() { uct.Register(component{}) }

func (component) Name() string { return componentName }

func (component) MDResources() ([]uct.MDResource, error) {
	return []uct.MDResource{{Name: componentName}}, nil
}

func (c component) OpenMD(name string, cfg *uct.Config) (uct.MD, error) {
	if name != componentName {
		return nil, fmt.Errorf("self: no md %q", name)
	}
	if cfg == nil {
		cfg = uct.DefaultConfig()
	}
	return newMD(c, cfg), nil
}
