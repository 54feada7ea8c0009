//go:build linux && cgo && !noverbs

package ib

import (
	"math"
	"net"
	"testing"

	"github.com/gouct/gouct/uct/internal/ibv"
)

func TestBandwidthEstimate(t *testing.T) {
	cases := []struct {
		speed, width uint8
		lag          int
		gbps         float64 // data rate in Gb/s
	}{
		{1, 1, 0, 2},            // SDR 1x: 2.5 Gb/s × 8b/10b
		{4, 2, 0, 32},           // QDR 4x: 40 Gb/s signalling, 32 data
		{16, 2, 0, 54.5454},     // FDR 4x: 56.25 × 64/66
		{32, 2, 0, 100},         // EDR 4x: 103.125 × 64/66
		{64, 2, 0, 206.0606},    // HDR 4x
		{32, 2, 2, 200},         // EDR 4x on a 2-port bond
		{32, 1, 0, 25},          // EDR 1x (25 GbE RoCE)
		{128, 16, 0, 206.06060}, // NDR 2x
	}
	for _, c := range cases {
		p := portInfo{attr: ibv.PortAttr{ActiveSpeed: c.speed, ActiveWidth: c.width}, lag: c.lag}
		p.estimate()
		if got := p.bw * 8 / 1e9; math.Abs(got-c.gbps) > 0.01 {
			t.Errorf("speed %d width %d lag %d: %.4f Gb/s, want %.4f", c.speed, c.width, c.lag, got, c.gbps)
		}
	}
	hw, sw := portInfo{}, portInfo{rxeSW: true}
	hw.estimate()
	sw.estimate()
	if !(hw.lat > 0 && sw.lat > hw.lat) {
		t.Errorf("latency estimates: hardware %v, software %v", hw.lat, sw.lat)
	}
}

func gidOf(ip string) [16]byte {
	var g [16]byte
	copy(g[:], net.ParseIP(ip).To16())
	return g
}

func TestChooseGID(t *testing.T) {
	gids := []ibv.GIDEntry{
		{Index: 0, Type: ibv.GIDTypeRoCEv2, GID: gidOf("fe80::1")},
		{Index: 1, Type: ibv.GIDTypeRoCEv2, GID: gidOf("10.77.0.1")},
		{Index: 2, Type: ibv.GIDTypeRoCEv1, GID: gidOf("10.78.0.1")},
		{Index: 3, Type: ibv.GIDTypeRoCEv2, GID: gidOf("10.78.0.1")},
	}
	for _, c := range []struct {
		want int
		ip   string
		idx  int
	}{
		{-1, "", 1},          // default: the first IPv4-mapped RoCE v2 GID (rxe: index 1)
		{-1, "10.78.0.1", 3}, // matching the IP, RoCE v2 only
		{-1, "10.99.0.1", 1}, // no match: default
		{0, "", 0},           // RDMANET_IB_GID_INDEX
		{2, "10.77.0.1", 2},
	} {
		var ip net.IP
		if c.ip != "" {
			ip = net.ParseIP(c.ip)
		}
		g, err := chooseGID(gids, c.want, ip)
		if err != nil || g.Index != c.idx {
			t.Errorf("chooseGID(%d, %s) = %d, %v; want %d", c.want, c.ip, g.Index, err, c.idx)
		}
	}
	if _, err := chooseGID(gids, 9, nil); err == nil {
		t.Error("GID index 9 (absent): no error")
	}
	if _, err := chooseGID(nil, -1, nil); err == nil {
		t.Error("empty GID table: no error")
	}
	if g, _ := chooseGID(gids[:1], -1, nil); g.Index != 0 {
		t.Errorf("only a link-local GID: chose %d", g.Index)
	}
}

// TestRoCEScope: the VM's layout (rxe0 on 10.77.0.1/24, rxe1/rxe2 on a veth
// pair in 10.78.0.0/24): a device reaches its own IP and its own link, not
// another local netdev's link; routed peers are left to the kernel.
func TestRoCEScope(t *testing.T) {
	cidr := func(s string) *net.IPNet {
		ip, n, err := net.ParseCIDR(s)
		if err != nil {
			t.Fatal(err)
		}
		n.IP = ip
		return n
	}
	rxe0 := &roceScope{own: net.ParseIP("10.77.0.1"), onLink: []*net.IPNet{cidr("10.77.0.1/24")},
		offLink: []*net.IPNet{cidr("10.78.0.1/24"), cidr("10.78.0.2/24"), cidr("10.0.2.15/24")}}
	rxe1 := &roceScope{own: net.ParseIP("10.78.0.1"), onLink: []*net.IPNet{cidr("10.78.0.1/24")},
		offLink: []*net.IPNet{cidr("10.77.0.1/24"), cidr("10.78.0.2/24")}}
	for _, c := range []struct {
		s    *roceScope
		peer string
		want bool
	}{
		{rxe0, "10.77.0.1", true}, {rxe0, "10.77.0.9", true}, {rxe0, "10.78.0.1", false},
		{rxe0, "10.78.0.2", false}, {rxe0, "192.0.2.7", true}, {rxe0, "127.0.0.1", false},
		{rxe1, "10.78.0.2", true}, {rxe1, "10.78.0.1", true}, {rxe1, "10.77.0.1", false},
	} {
		if got := c.s.reaches(net.ParseIP(c.peer)); got != c.want {
			t.Errorf("%v reaches %s = %v, want %v", c.s.own, c.peer, got, c.want)
		}
	}
	// The GID form (::ffff:a.b.c.d) compares equal to the IPv4 form.
	g := gidOf("10.77.0.1")
	if !rxe0.reaches(net.IP(g[:])) {
		t.Error("GID form of the own IP not reached")
	}
}
