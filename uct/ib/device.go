//go:build linux && cgo && !noverbs

package ib

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/gouct/gouct/uct"
	"github.com/gouct/gouct/uct/internal/ibv"
)

// portInfo is what the MD learned about one port at open.
type portInfo struct {
	num   int
	attr  ibv.PortAttr
	gids  []ibv.GIDEntry
	gid   ibv.GIDEntry // the GID endpoints use
	lag   int          // bonded slave count (RoCE LAG), 0 if not bonded
	bw    float64      // bytes/s
	lat   float64      // seconds
	rxeSW bool         // software device (rxe, siw)
}

// signalRate returns the per-lane signalling rate in Gb/s and the encoding
// efficiency for an active_speed code: 8b/10b up to QDR, 64b/66b from FDR
// (InfiniBand spec, vol 1, ch. 6; UCX uct_ib_iface_get_bw).
func signalRate(speed uint8) (gbps, enc float64) {
	switch speed {
	case 1:
		return 2.5, 0.8 // SDR
	case 2:
		return 5, 0.8 // DDR
	case 4:
		return 10, 0.8 // QDR
	case 8:
		return 10.3125, 64.0 / 66 // FDR10
	case 16:
		return 14.0625, 64.0 / 66 // FDR
	case 32:
		return 25.78125, 64.0 / 66 // EDR
	case 64:
		return 53.125, 64.0 / 66 // HDR
	case 128:
		return 106.25, 64.0 / 66 // NDR
	}
	return 2.5, 0.8
}

// laneCount maps active_width to lanes.
func laneCount(width uint8) int {
	switch width {
	case 1:
		return 1
	case 2:
		return 4
	case 4:
		return 8
	case 8:
		return 12
	case 16:
		return 2
	}
	return 1
}

// estimate fills bw and lat from the port speed, width and LAG.
func (p *portInfo) estimate() {
	gbps, enc := signalRate(p.attr.ActiveSpeed)
	bw := gbps * 1e9 * enc * float64(laneCount(p.attr.ActiveWidth)) / 8
	if p.lag > 1 {
		bw *= float64(p.lag)
	}
	p.bw = bw
	// Wire + HCA latency of a small send: ~0.8 µs on InfiniBand, a little
	// more over RoCE; a software device (rxe, siw) runs the transport on
	// the CPU and costs tens of µs.
	p.lat = 800e-9
	if p.attr.LinkLayer == ibv.LinkLayerEthernet {
		p.lat = 1100e-9
	}
	if p.rxeSW {
		p.lat = 15e-6
	}
}

// isIPv4Mapped reports a ::ffff:a.b.c.d GID.
func isIPv4Mapped(g [16]byte) bool {
	return net.IP(g[:]).To4() != nil && g[10] == 0xff && g[11] == 0xff
}

// chooseGID picks the GID endpoints use: index want if ≥ 0; else the
// RoCE v2 GID whose IP equals ip (when given); else the first IPv4-mapped
// RoCE v2 GID; else the first RoCE v2 GID; else the first GID.
func chooseGID(gids []ibv.GIDEntry, want int, ip net.IP) (ibv.GIDEntry, error) {
	if len(gids) == 0 {
		return ibv.GIDEntry{}, fmt.Errorf("no valid GID")
	}
	if want >= 0 {
		for _, g := range gids {
			if g.Index == want {
				return g, nil
			}
		}
		return ibv.GIDEntry{}, fmt.Errorf("GID index %d not valid (RDMANET_IB_GID_INDEX)", want)
	}
	v2 := func(g ibv.GIDEntry) bool { return g.Type == ibv.GIDTypeRoCEv2 }
	if ip != nil {
		for _, g := range gids {
			if v2(g) && net.IP(g.GID[:]).Equal(ip) {
				return g, nil
			}
		}
	}
	for _, g := range gids {
		if v2(g) && isIPv4Mapped(g.GID) {
			return g, nil
		}
	}
	for _, g := range gids {
		if v2(g) {
			return g, nil
		}
	}
	// Unknown types (old library): prefer an IPv4-mapped GID, which is RoCE v2 on rxe and mlx5.
	for _, g := range gids {
		if g.Type == ibv.GIDTypeUnknown && isIPv4Mapped(g.GID) {
			return g, nil
		}
	}
	return gids[0], nil
}

// lagSlaves counts the slaves of the bonded netdev behind a RoCE port
// (sysfs), 0 when the netdev is not a bond or cannot be found.
func lagSlaves(dev string, port int) int {
	nd, err := os.ReadFile(filepath.Join("/sys/class/infiniband", dev, "ports", fmt.Sprint(port), "gid_attrs/ndevs/0"))
	if err != nil {
		return 0
	}
	slaves, err := os.ReadFile(filepath.Join("/sys/class/net", strings.TrimSpace(string(nd)), "bonding/slaves"))
	if err != nil {
		return 0
	}
	return len(strings.Fields(string(slaves)))
}

// isSoftware reports a software RDMA device: Soft-RoCE (vendor id
// 0xffffff) or Soft-iWARP, or one named like them.
func isSoftware(dev string, vendor uint32) bool {
	return vendor == 0xffffff || strings.HasPrefix(dev, "rxe") || strings.HasPrefix(dev, "siw")
}

// ResourceForIP returns the rc_verbs device ("rxe1:1") whose RoCE v2 GID is
// ip, and that GID's index: the device to use for a bootstrap connection
// bound to ip (RoCE routes by IP, so a device on another netdev may not reach
// the peer). It fails with ErrUnavailable without verbs, or when no GID matches.
func ResourceForIP(ip net.IP) (device string, gidIndex int, err error) {
	if err := load(); err != nil {
		return "", -1, err
	}
	names, err := ibv.DeviceNames()
	if err != nil {
		return "", -1, fmt.Errorf("%w: %v", uct.ErrUnavailable, err)
	}
	for _, n := range names {
		ctx, err := ibv.Open(n)
		if err != nil {
			continue
		}
		da, err := ctx.QueryDevice()
		for port := 1; err == nil && port <= da.PhysPortCnt; port++ {
			gids, gerr := ctx.GIDs(port)
			if gerr != nil {
				continue
			}
			for _, g := range gids {
				if g.Type == ibv.GIDTypeRoCEv2 && net.IP(g.GID[:]).Equal(ip) {
					ctx.Close()
					return fmt.Sprintf("%s:%d", n, port), g.Index, nil
				}
			}
		}
		ctx.Close()
	}
	return "", -1, fmt.Errorf("%w: no RoCE v2 GID for %v", uct.ErrUnavailable, ip)
}

// roceScope is what a RoCE iface knows about IP reachability: RoCE v2
// routes by IP, and a device only reaches a peer the kernel would send to
// through the device's own netdev. Computed once at iface open.
type roceScope struct {
	own     net.IP       // the GID's IP
	onLink  []*net.IPNet // subnets of the GID's netdev
	offLink []*net.IPNet // subnets of the host's other netdevs
}

// newRoCEScope reads the host's interface addresses for the GID g.
func newRoCEScope(g ibv.GIDEntry) *roceScope {
	s := &roceScope{own: net.IP(append([]byte(nil), g.GID[:]...))}
	ifs, err := net.Interfaces()
	if err != nil {
		return s
	}
	for _, ifc := range ifs {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		mine := g.IfIndex != 0 && ifc.Index == g.IfIndex
		for _, a := range addrs {
			n, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			if g.IfIndex == 0 && n.IP.Equal(s.own) {
				mine = true
			}
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && ifc.Flags&net.FlagLoopback == 0 {
				if mine {
					s.onLink = append(s.onLink, n)
				} else {
					s.offLink = append(s.offLink, n)
				}
			}
		}
	}
	return s
}

// reaches reports whether a peer whose GID is the IP peer can be reached
// from this GID: the same GID (loopback on the device), a peer on the
// netdev's own subnets, or a routed peer that no other local netdev has on
// its link. A peer on another local netdev's link (a device of this host on
// another network, like rxe0 beside rxe1 in the VM) is not reachable: the
// kernel would send the packets out of a netdev without this device.
func (s *roceScope) reaches(peer net.IP) bool {
	if peer.Equal(s.own) {
		return true
	}
	for _, n := range s.onLink {
		if n.Contains(peer) {
			return true
		}
	}
	for _, n := range s.offLink {
		if n.Contains(peer) {
			return false
		}
	}
	return !peer.IsLoopback()
}
