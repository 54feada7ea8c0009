package rt

import (
	"net"
	"testing"

	"github.com/gouct/gouct/uct"
)

// TestDeviceForIPCache: one device lookup per IP (IPv4 in either form)
// until the entry expires, negative answers included; the cache stays
// bounded; loopback, unspecified and non-TCP addresses are never looked up.
func TestDeviceForIPCache(t *testing.T) {
	calls := 0
	t.Cleanup(SetDeviceLookupForTest(func(ip net.IP) (string, int, error) {
		calls++
		if ip.Equal(net.ParseIP("10.78.0.1")) {
			return "rxe1:1", 1, nil
		}
		return "", -1, uct.ErrUnavailable
	}))
	ip := net.ParseIP("10.78.0.1")
	for _, x := range []net.IP{ip, ip.To4(), ip} {
		if d := DeviceForAddr(&net.TCPAddr{IP: x, Port: 1}); d != "rxe1:1" {
			t.Fatalf("DeviceForAddr(%v) = %q", x, d)
		}
	}
	if calls != 1 {
		t.Fatalf("%d lookups for one IP, want 1", calls)
	}
	other := &net.TCPAddr{IP: net.ParseIP("192.0.2.1")}
	for range 3 {
		if d := DeviceForAddr(other); d != "" {
			t.Fatalf("DeviceForAddr(%v) = %q, want none", other, d)
		}
	}
	if calls != 2 {
		t.Fatalf("%d lookups, want 2 (a negative answer is cached)", calls)
	}
	for _, a := range []net.Addr{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}, &net.TCPAddr{IP: net.IPv6zero},
		&net.TCPAddr{}, &net.UnixAddr{Name: "x"}} {
		if d := DeviceForAddr(a); d != "" {
			t.Errorf("DeviceForAddr(%v) = %q, want none", a, d)
		}
	}
	if calls != 2 {
		t.Fatalf("%d lookups, want 2: loopback, unspecified and non-TCP are not looked up", calls)
	}
	// An expired entry is looked up again.
	var k [16]byte
	copy(k[:], ip.To16())
	deviceCache.Lock()
	e := deviceCache.m[k]
	e.at = e.at.Add(-deviceCacheTTL)
	deviceCache.m[k] = e
	deviceCache.Unlock()
	if d := deviceForIP(ip); d != "rxe1:1" || calls != 3 {
		t.Fatalf("after expiry: %q with %d lookups, want rxe1:1 with 3", d, calls)
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
