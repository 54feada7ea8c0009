//go:build !linux || !cgo || noverbs

// Package ib is the rc_verbs transport over rdma-core. This build has no
// verbs support (CGO_ENABLED=0, build tag noverbs, or not Linux): the "ib"
// component is registered and reports itself unavailable.
package ib

import (
	"fmt"
	"net"

	"github.com/gouct/gouct/uct"
	"github.com/gouct/gouct/uct/internal/ibv"
)

type component struct{}

func init() { uct.Register(component{}) }

func (component) Name() string { return "ib" }

func (component) MDResources() ([]uct.MDResource, error) {
	return nil, fmt.Errorf("%w: %v", uct.ErrUnavailable, ibv.Load())
}

func (component) OpenMD(name string, cfg *uct.Config) (uct.MD, error) {
	return nil, fmt.Errorf("%w: %v", uct.ErrUnavailable, ibv.Load())
}

// ResourceForIP would return the rc_verbs device whose RoCE v2 GID is ip;
// without verbs support it fails with ErrUnavailable.
func ResourceForIP(ip net.IP) (device string, gidIndex int, err error) {
	return "", -1, fmt.Errorf("%w: %v", uct.ErrUnavailable, ibv.Load())
}

// TestingEndpointQPs lists nothing without verbs support (see the verbs
// build's doc). For fault-injection tests only.
func TestingEndpointQPs() []TestingQP { return nil }

// TestingForceQPError fails with ErrUnavailable without verbs support. For
// fault-injection tests only.
func TestingForceQPError(q TestingQP) error {
	return fmt.Errorf("%w: %v", uct.ErrUnavailable, ibv.Load())
}

// UseGIDForIP does nothing without verbs support: there are no rc_verbs
// endpoints.
func UseGIDForIP(x uct.EP, ip net.IP) bool { return false }
