package rt

import (
	"net"
	"testing"
)

// TestDeviceForIPCache: one device lookup per IP (IPv4 in either form)
// until the entry expires, negative answers included; the cache stays
// bounded; loopback, unspecified and non-TCP addresses are never looked up.
func TestDeviceForIPCache(t *testing.T) {
	n := FakeDevicesForTest(t, map[string]string{"10.78.0.1": "rxe1:1", "fe80::1": "rxe1:1"})
	ip := net.ParseIP("10.78.0.1")
	for _, x := range []net.IP{ip, ip.To4(), ip} {
		if d := DeviceForAddr(&net.TCPAddr{IP: x, Port: 1}); d != "rxe1:1" {
			t.Fatalf("DeviceForAddr(%v) = %q", x, d)
		}
	}
	if *n != 1 {
		t.Fatalf("%d lookups for one IP, want 1", *n)
	}
	if d := DeviceForAddr(&net.TCPAddr{IP: net.ParseIP("fe80::1"), Port: 1, Zone: "rxeveth0"}); d != "rxe1:1" {
		t.Fatalf("DeviceForAddr(fe80::1%%rxeveth0) = %q", d)
	}
	*n = 1
	other := &net.TCPAddr{IP: net.ParseIP("192.0.2.1")}
	for range 3 {
		if d := DeviceForAddr(other); d != "" {
			t.Fatalf("DeviceForAddr(%v) = %q, want none", other, d)
		}
	}
	if *n != 2 {
		t.Fatalf("%d lookups, want 2 (a negative answer is cached)", *n)
	}
	for _, a := range []net.Addr{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}, &net.TCPAddr{IP: net.IPv6zero},
		&net.TCPAddr{}, &net.UnixAddr{Name: "x"}} {
		if d := DeviceForAddr(a); d != "" {
			t.Errorf("DeviceForAddr(%v) = %q, want none", a, d)
		}
	}
	if *n != 2 {
		t.Fatalf("%d lookups, want 2: loopback, unspecified and non-TCP are not looked up", *n)
	}
	// An expired entry is looked up again.
	var k [16]byte
	copy(k[:], ip.To16())
	deviceCache.Lock()
	e := deviceCache.m[k]
	e.at = e.at.Add(-deviceCacheTTL)
	deviceCache.m[k] = e
	deviceCache.Unlock()
	if d := deviceForIP(ip); d != "rxe1:1" || *n != 3 {
		t.Fatalf("after expiry: %q with %d lookups, want rxe1:1 with 3", d, *n)
	}
	for i := range 3 * deviceCacheMax {
		deviceForIP(net.IPv4(10, 1, byte(i>>8), byte(i)))
		deviceCache.Lock()
		n := len(deviceCache.m)
		deviceCache.Unlock()
		if n > deviceCacheMax {
			t.Fatalf("cache holds %d IPs, max %d", n, deviceCacheMax)
		}
	}
}
