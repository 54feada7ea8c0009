package rt

import (
	"net"
	"sync"
	"time"

	"github.com/gouct/gouct/uct"
	"github.com/gouct/gouct/uct/ib"
)

// DeviceForAddr returns the RDMA device ("rxe1:1") whose RoCE v2 GID is the
// IP of a, a bootstrap socket's local address, or "" (not a TCP address,
// loopback or unspecified IP, no RDMA device has it). The dialer and the
// listener run rc_verbs conns on that device, so RDMA follows the route the
// application chose. It scans the host's devices (ib.ResourceForIP) at most
// once per IP and deviceCacheTTL. Safe for concurrent use.
func DeviceForAddr(a net.Addr) string {
	ta, ok := a.(*net.TCPAddr)
	if !ok || ta.IP == nil || ta.IP.IsLoopback() || ta.IP.IsUnspecified() {
		return ""
	}
	return deviceForIP(ta.IP)
}

// deviceCache remembers which RDMA device has an IP (ib.ResourceForIP opens
// every device to read its GID table: milliseconds per handshake side,
// 12-40 ms in the Soft-RoCE VM under -race). Entries expire after
// deviceCacheTTL, so a GID added or removed is seen within that time;
// negative answers are cached too (a bootstrap on a netdev without RDMA).
// At most deviceCacheMax IPs (this host's addresses): full, it starts over.
var deviceCache = struct {
	sync.Mutex
	m      map[[16]byte]deviceEntry
	lookup func(net.IP) (string, int, error) // ib.ResourceForIP; tests replace it
}{m: map[[16]byte]deviceEntry{}, lookup: ib.ResourceForIP}

const (
	deviceCacheTTL = 10 * time.Second
	deviceCacheMax = 64
)

type deviceEntry struct {
	dev string
	at  time.Time
}

// deviceForIP returns the device whose RoCE v2 GID is ip, or "", through
// deviceCache. Concurrent misses may both look up.
func deviceForIP(ip net.IP) string {
	var k [16]byte
	copy(k[:], ip.To16())
	now := time.Now()
	deviceCache.Lock()
	e, ok := deviceCache.m[k]
	lookup := deviceCache.lookup
	deviceCache.Unlock()
	if ok && now.Sub(e.at) < deviceCacheTTL {
		return e.dev
	}
	dev, _, err := lookup(ip)
	if err != nil {
		dev = ""
	}
	deviceCache.Lock()
	if len(deviceCache.m) >= deviceCacheMax {
		clear(deviceCache.m)
	}
	deviceCache.m[k] = deviceEntry{dev: dev, at: now}
	deviceCache.Unlock()
	return dev
}

// SetDeviceLookupForTest replaces the IP -> device lookup behind
// DeviceForAddr and empties its cache; the returned func restores both. For
// tests of the dialer and listener only.
func SetDeviceLookupForTest(f func(net.IP) (string, int, error)) (restore func()) {
	deviceCache.Lock()
	old := deviceCache.lookup
	deviceCache.lookup = f
	clear(deviceCache.m)
	deviceCache.Unlock()
	return func() {
		deviceCache.Lock()
		deviceCache.lookup = old
		clear(deviceCache.m)
		deviceCache.Unlock()
	}
}

// FakeDevicesForTest makes DeviceForAddr answer from devs (IP string ->
// device) for the rest of the test t, counting its lookups in *calls. For
// tests of the dialer and listener only.
func FakeDevicesForTest(t interface{ Cleanup(func()) }, devs map[string]string) (calls *int) {
	calls = new(int)
	t.Cleanup(SetDeviceLookupForTest(func(ip net.IP) (string, int, error) {
		*calls++
		if d, ok := devs[ip.String()]; ok {
			return d, 1, nil
		}
		return "", -1, uct.ErrUnavailable
	}))
	return calls
}
