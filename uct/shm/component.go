//go:build linux

package shm

import (
	"fmt"

	"github.com/gouct/gouct/uct"
)

const (
	componentName = "shm"
	mdName        = "posix"
	tlName        = "shm"
	deviceName    = "memory"
)

type component struct{}

func init() { uct.Register(component{}) }

func (component) Name() string { return componentName }

// MDResources reports the single "posix" memory domain, or why shared memory
// is unavailable (no memfd_create, no /proc).
func (component) MDResources() ([]uct.MDResource, error) {
	if _, err := hostIdentity(); err != nil {
		return nil, fmt.Errorf("shm: %v: %w", err, uct.ErrUnavailable)
	}
	return []uct.MDResource{{Name: mdName}}, nil
}

func (c component) OpenMD(name string, cfg *uct.Config) (uct.MD, error) {
	if name != mdName {
		return nil, fmt.Errorf("shm: no md %q: %w", name, uct.ErrInvalidParam)
	}
	if cfg == nil {
		cfg = uct.DefaultConfig()
	}
	return newMD(c, cfg), nil
}
