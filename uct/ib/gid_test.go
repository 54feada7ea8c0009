package ib_test

import (
	"bytes"
	"net"
	"testing"

	"github.com/gouct/gouct/uct/ib"
)

// linkLocalOf returns the IPv6 link-local address of the netdev that has v4.
func linkLocalOf(t *testing.T, v4 string) net.IP {
	t.Helper()
	ifs, _ := net.Interfaces()
	for _, ifc := range ifs {
		addrs, _ := ifc.Addrs()
		var has bool
		var ll net.IP
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				has = has || n.IP.Equal(net.ParseIP(v4))
				if n.IP.IsLinkLocalUnicast() && n.IP.To4() == nil {
					ll = n.IP
				}
			}
		}
		if has && ll != nil {
			return ll
		}
	}
	t.Fatalf("no IPv6 link-local address beside %s", v4)
	return nil
}

// TestUseGIDForIP: the veth pair's devices (rxe1 on 10.78.0.1 -> rxe2 on
// 10.78.0.2 in the VM, whatever IBTEST_DEV_A/B say) over their IPv6
// link-local GIDs instead of the ports' IPv4 ones (the automatic choice):
// the endpoint addresses carry those GIDs and every operation works;
// another IP, or a connected endpoint, keeps the GID.
func TestUseGIDForIP(t *testing.T) {
	needRDMA(t)
	devs := make([]string, 2)
	for i, ip := range []string{"10.78.0.1", "10.78.0.2"} {
		var err error
		if devs[i], _, err = ib.ResourceForIP(net.ParseIP(ip)); err != nil {
			if inVM() {
				t.Fatalf("RXEVM=1 but no device on %s (the veth pair): %v", ip, err)
			}
			t.Skipf("no device on %s: %v", ip, err)
		}
	}
	ipA, ipB := linkLocalOf(t, "10.78.0.1"), linkLocalOf(t, "10.78.0.2")
	a, b := openEPs(t, devs[0], devs[1])
	if ib.UseGIDForIP(a.ep, net.ParseIP("192.0.2.1")) || ib.UseGIDForIP(a.ep, ipB) {
		t.Fatal("UseGIDForIP took an IP its port does not have")
	}
	if !ib.UseGIDForIP(a.ep, ipA) || !ib.UseGIDForIP(b.ep, ipB) {
		t.Fatal("UseGIDForIP: no link-local RoCE v2 GID")
	}
	aa, _ := a.ep.Address()
	ba, _ := b.ep.Address()
	if !net.IP(aa[8:24]).Equal(ipA) || !net.IP(ba[8:24]).Equal(ipB) {
		t.Fatalf("ep GIDs %v, %v; want %v, %v", net.IP(aa[8:24]), net.IP(ba[8:24]), ipA, ipB)
	}
	if bytes.Equal(a.iface.DeviceAddress()[3:], aa[8:24]) {
		t.Fatalf("the port's GID is already %v: nothing tested", ipA)
	}
	connectEPs(t, a, b)
	if ib.UseGIDForIP(a.ep, ipA) {
		t.Error("UseGIDForIP changed a connected endpoint")
	}
	exercise(t, a, b, devs[0]+"->"+devs[1]+" over IPv6 link-local GIDs")
}
