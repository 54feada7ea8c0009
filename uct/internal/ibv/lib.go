//go:build linux && cgo && !noverbs

package ibv

/*
#cgo CFLAGS: -O2
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"syscall"
	"unsafe"
)

// LibName is the shared object Load opens.
const LibName = "libibverbs.so.1"

var (
	loadOnce sync.Once
	loadErr  error
)

// Load opens libibverbs and resolves its symbols, once per process. Its error
// reads "libibverbs not found: <dlerror>" when the library is absent. Safe
// for concurrent use.
func Load() error {
	loadOnce.Do(func() { loadErr = load(LibName) })
	return loadErr
}

func load(lib string) error {
	cs := C.CString(lib)
	defer C.free(unsafe.Pointer(cs))
	var buf [256]C.char
	if C.gouct_load(cs, &buf[0], C.size_t(len(buf))) != 0 {
		return fmt.Errorf("libibverbs not found: %s", C.GoString(&buf[0]))
	}
	return nil
}

// DeviceNames lists the RDMA devices (ibv_get_device_list). On a kernel
// without RDMA support it fails with an error wrapping syscall.ENOSYS.
func DeviceNames() ([]string, error) {
	if err := Load(); err != nil {
		return nil, err
	}
	const max = 64
	names := make([]byte, 64*max)
	n := C.gouct_device_names((*C.char)(unsafe.Pointer(&names[0])), max)
	if n < 0 {
		return nil, fmt.Errorf("ibv_get_device_list: %w", syscall.Errno(-n))
	}
	out := make([]string, 0, int(n))
	for i := 0; i < int(n); i++ {
		s := names[64*i : 64*(i+1)]
		for j, c := range s {
			if c == 0 {
				s = s[:j]
				break
			}
		}
		out = append(out, string(s))
	}
	return out, nil
}

func errnoOr(err error, def syscall.Errno) error {
	if e, ok := err.(syscall.Errno); ok && e != 0 {
		return e
	}
	return def
}

// Context is an opened device (struct ibv_context).
type Context struct {
	p    *C.struct_ibv_context
	name string
}

// Open opens device name.
func Open(name string) (*Context, error) {
	if err := Load(); err != nil {
		return nil, err
	}
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	p, err := C.gouct_open(cs)
	if p == nil {
		return nil, fmt.Errorf("ibv_open_device %s: %w", name, errnoOr(err, syscall.ENODEV))
	}
	return &Context{p: p, name: name}, nil
}

// Name is the device name.
func (c *Context) Name() string { return c.name }

// Close closes the device; every resource made from it must be closed first.
func (c *Context) Close() error {
	if c == nil || c.p == nil {
		return nil
	}
	rc := C.gouct_close(c.p)
	c.p = nil
	if rc != 0 {
		return fmt.Errorf("ibv_close_device %s: %w", c.name, syscall.Errno(rc))
	}
	return nil
}

// DeviceAttr is the subset of struct ibv_device_attr gouct uses.
type DeviceAttr struct {
	MaxMRSize    uint64
	VendorID     uint32
	VendorPartID uint32
	MaxQPWR      int
	MaxSGE       int
	MaxCQE       int
	MaxQPRdAtom  int
	MaxSRQWR     int
	MaxSRQSGE    int
	PhysPortCnt  int
}

// QueryDevice returns the device attributes.
func (c *Context) QueryDevice() (DeviceAttr, error) {
	var a C.struct_ibv_device_attr
	if rc := C.gouct_query_device(c.p, &a); rc != 0 {
		return DeviceAttr{}, fmt.Errorf("ibv_query_device %s: %w", c.name, syscall.Errno(rc))
	}
	return DeviceAttr{MaxMRSize: uint64(a.max_mr_size), VendorID: uint32(a.vendor_id),
		VendorPartID: uint32(a.vendor_part_id), MaxQPWR: int(a.max_qp_wr), MaxSGE: int(a.max_sge),
		MaxCQE: int(a.max_cqe), MaxQPRdAtom: int(a.max_qp_rd_atom), MaxSRQWR: int(a.max_srq_wr),
		MaxSRQSGE: int(a.max_srq_sge), PhysPortCnt: int(a.phys_port_cnt)}, nil
}

// Port states, link layers (struct ibv_port_attr).
const (
	PortActive          = C.IBV_PORT_ACTIVE
	LinkLayerInfiniBand = C.IBV_LINK_LAYER_INFINIBAND
	LinkLayerEthernet   = C.IBV_LINK_LAYER_ETHERNET
)

// PortAttr is the subset of struct ibv_port_attr gouct uses. MTUs are the
// enum ibv_mtu values (1: 256 B … 5: 4096 B).
type PortAttr struct {
	State       int
	MaxMTU      int
	ActiveMTU   int
	GIDTblLen   int
	MaxMsgSize  uint32
	LID         uint16
	ActiveWidth uint8
	ActiveSpeed uint8
	LinkLayer   uint8
}

// QueryPort returns the attributes of port (1-based).
func (c *Context) QueryPort(port int) (PortAttr, error) {
	var a C.struct_ibv_port_attr
	if rc := C.gouct_query_port(c.p, C.uint8_t(port), &a); rc != 0 {
		return PortAttr{}, fmt.Errorf("ibv_query_port %s:%d: %w", c.name, port, syscall.Errno(rc))
	}
	return PortAttr{State: int(a.state), MaxMTU: int(a.max_mtu), ActiveMTU: int(a.active_mtu),
		GIDTblLen: int(a.gid_tbl_len), MaxMsgSize: uint32(a.max_msg_sz), LID: uint16(a.lid),
		ActiveWidth: uint8(a.active_width), ActiveSpeed: uint8(a.active_speed),
		LinkLayer: uint8(a.link_layer)}, nil
}

// GID types (enum ibv_gid_type).
const (
	GIDTypeIB      = 0
	GIDTypeRoCEv1  = 1
	GIDTypeRoCEv2  = 2
	GIDTypeUnknown = -1
)

// GIDEntry is one valid GID table entry.
type GIDEntry struct {
	GID     [16]byte
	Index   int
	Type    int // GIDType*; GIDTypeUnknown when the library cannot say
	IfIndex int // netdev of a RoCE GID (0: none or unknown)
}

// GIDs returns the valid GID entries of port: through ibv_query_gid_table
// where the library has it, else the first entries by ibv_query_gid with
// unknown types.
func (c *Context) GIDs(port int) ([]GIDEntry, error) {
	var ents [128]C.struct_ibv_gid_entry
	n := C.gouct_gid_table(c.p, &ents[0], C.size_t(len(ents)))
	if n >= 0 {
		out := make([]GIDEntry, 0, int(n))
		for _, e := range ents[:n] {
			if int(e.port_num) != port {
				continue
			}
			g := GIDEntry{Index: int(e.gid_index), Type: int(e.gid_type), IfIndex: int(e.ndev_ifindex)}
			copy(g.GID[:], C.GoBytes(unsafe.Pointer(&e.gid), 16))
			out = append(out, g)
		}
		return out, nil
	}
	pa, err := c.QueryPort(port)
	if err != nil {
		return nil, err
	}
	var out []GIDEntry
	for i := 0; i < pa.GIDTblLen && i < 16; i++ {
		var g C.union_ibv_gid
		if C.gouct_query_gid(c.p, C.uint8_t(port), C.int(i), &g) != 0 {
			continue
		}
		e := GIDEntry{Index: i, Type: GIDTypeUnknown}
		copy(e.GID[:], C.GoBytes(unsafe.Pointer(&g), 16))
		if e.GID != ([16]byte{}) {
			out = append(out, e)
		}
	}
	return out, nil
}

// Fork status (enum ibv_fork_status).
const (
	ForkDisabled = C.IBV_FORK_DISABLED
	ForkEnabled  = C.IBV_FORK_ENABLED
	ForkUnneeded = C.IBV_FORK_UNNEEDED
	ForkUnknown  = -1
)

// ForkStatus is ibv_is_fork_initialized, or ForkUnknown on old libraries.
func ForkStatus() int { return int(C.gouct_fork_status()) }

// ForkInit is ibv_fork_init: call it before the first registration, where
// ForkStatus says ForkDisabled.
func ForkInit() error {
	if rc := C.gouct_fork_init(); rc != 0 {
		return fmt.Errorf("ibv_fork_init: %w", syscall.Errno(rc))
	}
	return nil
}

// Async event types (enum ibv_event_type) gouct acts on.
const (
	EventQPFatal         = C.IBV_EVENT_QP_FATAL
	EventQPReqErr        = C.IBV_EVENT_QP_REQ_ERR
	EventQPAccessErr     = C.IBV_EVENT_QP_ACCESS_ERR
	EventPathMigErr      = C.IBV_EVENT_PATH_MIG_ERR
	EventQPLastWQE       = C.IBV_EVENT_QP_LAST_WQE_REACHED
	EventPortActive      = C.IBV_EVENT_PORT_ACTIVE
	EventPortErr         = C.IBV_EVENT_PORT_ERR
	EventDeviceFatal     = C.IBV_EVENT_DEVICE_FATAL
	EventCQErr           = C.IBV_EVENT_CQ_ERR
	EventSRQErr          = C.IBV_EVENT_SRQ_ERR
	EventSRQLimitReached = C.IBV_EVENT_SRQ_LIMIT_REACHED
)

// AsyncEvent is one event of the device's async event queue: its type and
// the QP number (QP events) or port (port events) it names, else 0.
type AsyncEvent struct {
	Type int
	QPN  uint32
	Port int
}

// AsyncFD is the device's async event file descriptor, owned by the
// context (closed by Close).
func (c *Context) AsyncFD() int { return int(C.gouct_async_fd(c.p)) }

// DevPath is the device's uverbs sysfs directory
// (/sys/class/infiniband_verbs/uverbsN): it disappears when the device is
// being removed, before the kernel waits for users to close it.
func (c *Context) DevPath() string { return C.GoString(C.gouct_dev_path(c.p)) }

// GetAsyncEvent reads and acknowledges one async event (ibv_get_async_event,
// ibv_ack_async_event); on a non-blocking fd without events it returns
// syscall.EAGAIN. Not safe for concurrent use with Close.
func (c *Context) GetAsyncEvent() (AsyncEvent, error) {
	r := int64(C.gouct_get_async_event(c.p))
	if r < 0 {
		return AsyncEvent{}, syscall.Errno(-r)
	}
	return AsyncEvent{Type: int(r & 0xff), Port: int(r >> 8 & 0xff), QPN: uint32(r >> 16)}, nil
}

// EventString names an async event type.
func EventString(t int) string {
	switch t {
	case EventQPFatal:
		return "QP fatal"
	case EventQPReqErr:
		return "QP invalid request"
	case EventQPAccessErr:
		return "QP access error"
	case EventPathMigErr:
		return "path migration error"
	case EventQPLastWQE:
		return "QP last WQE reached (QP in error)"
	case EventPortActive:
		return "port active"
	case EventPortErr:
		return "port error"
	case EventDeviceFatal:
		return "device fatal"
	case EventCQErr:
		return "CQ error"
	case EventSRQErr:
		return "SRQ error"
	}
	return fmt.Sprintf("async event %d", t)
}
