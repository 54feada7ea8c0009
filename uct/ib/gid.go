//go:build linux && cgo && !noverbs

package ib

import (
	"net"

	"github.com/gouct/gouct/uct"
	"github.com/gouct/gouct/uct/internal/ibv"
)

// UseGIDForIP makes x, an rc_verbs endpoint created unconnected and whose
// Address was not taken yet, use its port's RoCE v2 GID whose IP is ip (the
// bootstrap socket's local IP), so that the QP's traffic leaves from the
// address the TCP connection used when the netdev has several (IPv4 and
// IPv6, several IPv4). It reports whether it did: false for another
// transport's endpoint, an InfiniBand port, a GID index forced by
// RDMANET_IB_GID_INDEX, a connected endpoint, or no such GID (the endpoint
// keeps its port's GID). Call it before Address and ConnectToEP, from the
// goroutine that owns the endpoint.
func UseGIDForIP(x uct.EP, ip net.IP) bool {
	e, ok := x.(*ep)
	if !ok || ip == nil {
		return false
	}
	i := e.i
	if i.port.attr.LinkLayer != ibv.LinkLayerEthernet || i.md.cfg.IBGIDIndex >= 0 {
		return false
	}
	for _, g := range i.port.gids {
		if g.Type != ibv.GIDTypeRoCEv2 || !net.IP(g.GID[:]).Equal(ip) {
			continue
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.state != epCreated {
			return false
		}
		e.gid = g
		return true
	}
	return false
}
