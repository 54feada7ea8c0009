package tcp

import (
	"fmt"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/gouct/gouct/uct"
)

// md is the tcp memory domain: sockets need no registration, so Register is
// a no-op (nil MemH) and there are no rkeys. Safe for concurrent use.
type md struct {
	comp component
	cfg  *uct.Config
}

func (m *md) Name() string             { return mdName }
func (m *md) Component() uct.Component { return m.comp }

// Attr: no registration capability, no rkeys.
func (m *md) Attr() uct.MDAttr { return uct.MDAttr{} }

// Register does nothing: AMZcopy writes straight from the caller's buffers.
func (m *md) Register(b []byte, access uct.Access) (uct.MemH, error) { return nil, nil }

func (m *md) Deregister(uct.MemH) error { return nil }

func (m *md) PackRKey(uct.MemH) ([]byte, error) {
	return nil, uct.NotSupported("tcp: remote keys (no RMA over tcp)")
}

// MemAlloc returns ordinary Go memory: nothing needs to be registered.
func (m *md) MemAlloc(size int) (uct.Mem, error) {
	if size < 0 {
		return uct.Mem{}, fmt.Errorf("tcp: mem alloc %d bytes: %w", size, uct.ErrInvalidParam)
	}
	return uct.Mem{Buf: make([]byte, size)}, nil
}

func (m *md) MemFree(uct.Mem) error { return nil }

func (m *md) TLResources() ([]uct.TLResource, error) {
	devs, err := devices()
	if err != nil {
		return nil, fmt.Errorf("tcp: list interfaces: %w", err)
	}
	out := make([]uct.TLResource, 0, len(devs))
	for _, d := range devs {
		out = append(out, uct.TLResource{TL: tlName, Device: d.name, Type: uct.DeviceNet})
	}
	return out, nil
}

func (m *md) OpenIface(w *uct.Worker, tl uct.TLResource, p uct.IfaceParams) (uct.Iface, error) {
	if tl.TL != tlName {
		return nil, fmt.Errorf("tcp: no transport %q: %w", tl.TL, uct.ErrInvalidParam)
	}
	devs, err := devices()
	if err != nil {
		return nil, fmt.Errorf("tcp: list interfaces: %w", err)
	}
	for _, d := range devs {
		if d.name == tl.Device {
			return newIface(m, w, d, p)
		}
	}
	return nil, fmt.Errorf("tcp: device %q is gone or has no IPv4 address: %w", tl.Device, uct.ErrUnavailable)
}

func (m *md) Close() error { return nil }

// device is a network interface with its first IPv4 address.
type device struct {
	name     string
	ip       net.IP // 4 bytes
	mask     net.IPMask
	loopback bool
	bw       float64 // link bandwidth in bytes per second
}

// devices lists the IPv4 interfaces that are up: loopback first, then by name.
func devices() ([]device, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	var out []device
	for _, nif := range ifs {
		if nif.Flags&net.FlagUp == 0 {
			continue
		}
		addrs, err := nif.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip4 := ipn.IP.To4()
			if ip4 == nil || len(ipn.Mask) != net.IPv4len {
				continue
			}
			lo := nif.Flags&net.FlagLoopback != 0
			out = append(out, device{name: nif.Name, ip: ip4, mask: ipn.Mask, loopback: lo, bw: linkBandwidth(nif.Name, lo)})
			break
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].loopback != out[j].loopback {
			return out[i].loopback
		}
		return out[i].name < out[j].name
	})
	return out, nil
}

// linkBandwidth is the link speed in bytes per second from sysfs (Mb/s);
// loopback gets what Go TCP over loopback reaches on these machines
// (DESIGN.md "Calibration": 3.2-3.6 GB/s); an unknown speed counts as 1 Gb/s.
func linkBandwidth(name string, loopback bool) float64 {
	if loopback {
		return 3e9
	}
	b, err := os.ReadFile("/sys/class/net/" + name + "/speed")
	if err == nil {
		if mbps, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && mbps > 0 {
			return float64(mbps) * 1e6 / 8 * 0.95 // less TCP/IP framing
		}
	}
	return 1e9 / 8
}
