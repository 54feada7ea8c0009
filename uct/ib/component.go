//go:build linux && cgo && !noverbs

// Package ib is the rc_verbs transport (UCX uct/ib/rc/verbs): reliable
// connected queue pairs over rdma-core's libibverbs, loaded at first use, so
// binaries start on hosts without it and the component says why it is
// unavailable. Import it for its side effect of registering the "ib"
// component.
//
// One MD per RDMA device (its protection domain); one rc_verbs resource per
// active port ("rxe0:1"); one iface per (MD, worker, port) with a send CQ, a
// receive CQ and a shared receive queue of pre-posted registered buffers; one
// RC QP per endpoint, connected endpoint to endpoint (Address, ConnectToEP).
//
// On the wire an active message is a SEND with immediate data: the
// immediate is the AM id, the payload lands in one pre-posted receive buffer
// (AMShort: 8-byte little-endian header then payload, sent inline; AMBcopy:
// what pack wrote, from a registered bounce buffer; AMZcopy: header from a
// bounce buffer then the caller's registered iov). PutZcopy and GetZcopy are
// RDMA WRITE and READ with the peer's 4-byte rkey. Every send is signalled;
// completions arrive in posting order per QP and release resources, fire
// Completions and flushes, and dispatch pending requests.
//
// Faults: a failed completion fails its endpoint (ErrEndpointReset, through
// IfaceParams.ErrHandler). Each iface's event goroutine also wakes every
// 200 ms to check its device: QP error async events fail their endpoint
// (confirmed with ibv_query_qp); a fatal device, CQ or SRQ event, or the
// device's removal (its uverbs sysfs entry vanishes: Soft-RoCE raises no
// event, and `rdma link delete` waits until every user has closed the
// device) fails every endpoint of the MD at once and releases all its
// verbs resources and registrations (md.kill), after which the iface
// reports Failed and refuses new endpoints. RegStats counts live
// registrations for leak checks.
//
// Verified on Soft-RoCE in a VM by scripts/vm-test.sh (make test).
package ib

import (
	"errors"
	"fmt"
	"sync"
	"syscall"

	"github.com/gouct/gouct/uct"
	"github.com/gouct/gouct/uct/internal/ibv"
)

const (
	componentName = "ib"
	tlName        = "rc_verbs"
)

type component struct{}

func init() { uct.Register(component{}) }

func (component) Name() string { return componentName }

var (
	forkOnce sync.Once
	forkErr  error
)

// load opens libibverbs and, before anything is registered, makes the
// process fork-safe where the kernel does not copy pinned pages on fork (the
// seed's copy-on-write hazard; kernels ≥ 5.13 report IBV_FORK_UNNEEDED).
// RDMAV_FORK_SAFE=1 makes libibverbs do the same by itself.
func load() error {
	if err := ibv.Load(); err != nil {
		return fmt.Errorf("%w: %v", uct.ErrUnavailable, err)
	}
	forkOnce.Do(func() {
		if ibv.ForkStatus() == ibv.ForkDisabled {
			forkErr = ibv.ForkInit()
		}
	})
	return nil
}

// MDResources lists the RDMA devices, or says why there are none.
func (component) MDResources() ([]uct.MDResource, error) {
	if err := load(); err != nil {
		return nil, err
	}
	names, err := ibv.DeviceNames()
	if errors.Is(err, syscall.ENOSYS) {
		return nil, fmt.Errorf("%w: no RDMA support in the kernel (%v)", uct.ErrUnavailable, err)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", uct.ErrUnavailable, err)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%w: no RDMA devices", uct.ErrUnavailable)
	}
	out := make([]uct.MDResource, len(names))
	for i, n := range names {
		out[i] = uct.MDResource{Name: n}
	}
	return out, nil
}

// OpenMD opens device name.
func (c component) OpenMD(name string, cfg *uct.Config) (uct.MD, error) {
	if err := load(); err != nil {
		return nil, err
	}
	if forkErr != nil {
		return nil, fmt.Errorf("ib: %w", forkErr)
	}
	if cfg == nil {
		cfg = uct.DefaultConfig()
	}
	return openMD(c, name, cfg)
}
