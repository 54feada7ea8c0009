package dialer

import (
	"net"
	"slices"
	"testing"

	"github.com/gouct/gouct/internal/rt"
	"github.com/gouct/gouct/uct"
)

func tr(tl, dev string) *rt.Transport {
	return &rt.Transport{TI: &uct.TLIface{Resource: uct.TLResource{TL: tl, Device: dev}}}
}

func names(ts []*rt.Transport) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.TI.Resource.Name())
	}
	return out
}

// TestPreferDevice: the rc_verbs transport on the bootstrap IP's device
// moves to the front of the Hello's candidates, the others keep their order.
func TestPreferDevice(t *testing.T) {
	shm, self := tr("shm", "memory"), tr("self", "self")
	rxe0, rxe1, rxe2 := tr("rc_verbs", "rxe0:1"), tr("rc_verbs", "rxe1:1"), tr("rc_verbs", "rxe2:1")
	other := tr("ud_verbs", "rxe1:1") // another TL on that device stays put
	for _, tc := range []struct {
		name string
		ts   []*rt.Transport
		dev  string
		want []*rt.Transport
	}{
		{"middle", []*rt.Transport{rxe0, rxe1, rxe2}, "rxe1:1", []*rt.Transport{rxe1, rxe0, rxe2}},
		{"last", []*rt.Transport{shm, rxe0, rxe1, rxe2}, "rxe2:1", []*rt.Transport{rxe2, shm, rxe0, rxe1}},
		{"first", []*rt.Transport{rxe0, rxe1}, "rxe0:1", []*rt.Transport{rxe0, rxe1}},
		{"not open", []*rt.Transport{self, shm, rxe0}, "rxe5:1", []*rt.Transport{self, shm, rxe0}},
		{"rc_verbs only", []*rt.Transport{other, rxe0, rxe1}, "rxe1:1", []*rt.Transport{rxe1, other, rxe0}},
		{"empty", nil, "rxe0:1", []*rt.Transport{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.ts)
			got := preferDevice(tc.ts, tc.dev)
			if !slices.Equal(got, tc.want) {
				t.Errorf("preferDevice(%v, %s) = %v, want %v", names(tc.ts), tc.dev, names(got), names(tc.want))
			}
			if !slices.Equal(in, tc.ts) {
				t.Errorf("preferDevice modified its argument: %v", names(tc.ts))
			}
		})
	}
}

// TestBootstrapDeviceNoLookup: addresses no RDMA device can have, and
// transport lists without rc_verbs, give no device.
func TestBootstrapDeviceNoLookup(t *testing.T) {
	calls := fakeLookup(t, map[string]string{"10.77.0.1": "rxe0:1"})
	rc := []*rt.Transport{tr("rc_verbs", "rxe0:1")}
	for _, tc := range []struct {
		name string
		ts   []*rt.Transport
		a    net.Addr
	}{
		{"loopback", rc, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}},
		{"loopback6", rc, &net.TCPAddr{IP: net.IPv6loopback, Port: 1}},
		{"unspecified", rc, &net.TCPAddr{IP: net.IPv6unspecified, Port: 1}},
		{"no IP", rc, &net.TCPAddr{Port: 1}},
		{"unix", rc, &net.UnixAddr{Name: "/x", Net: "unix"}},
		{"nil", rc, nil},
		{"no rc_verbs", []*rt.Transport{tr("shm", "memory")}, &net.TCPAddr{IP: net.IPv4(10, 77, 0, 1)}},
	} {
		if dev := bootstrapDevice(tc.ts, tc.a); dev != "" {
			t.Errorf("%s: bootstrapDevice = %q, want none", tc.name, dev)
		}
	}
	if *calls != 0 {
		t.Errorf("%d device lookups, want none", *calls)
	}
}

// fakeLookup replaces the IP -> device lookup behind rt.DeviceForAddr for
// a test with a table lookup that counts its calls (cache emptied).
func fakeLookup(t *testing.T, devs map[string]string) *int {
	t.Helper()
	calls := new(int)
	t.Cleanup(rt.SetDeviceLookupForTest(func(ip net.IP) (string, int, error) {
		*calls++
		if d, ok := devs[ip.String()]; ok {
			return d, 1, nil
		}
		return "", -1, uct.ErrUnavailable
	}))
	return calls
}

// TestBootstrapDevice: the device of the socket's IP when there is an
// rc_verbs transport, whatever the IP's form.
func TestBootstrapDevice(t *testing.T) {
	fakeLookup(t, map[string]string{"10.78.0.1": "rxe1:1", "fe80::1": "rxe1:1"})
	ts := []*rt.Transport{tr("rc_verbs", "rxe1:1"), tr("shm", "memory")}
	for _, a := range []*net.TCPAddr{
		{IP: net.ParseIP("10.78.0.1"), Port: 1},
		{IP: net.IPv4(10, 78, 0, 1).To4(), Port: 1},
		{IP: net.ParseIP("fe80::1"), Port: 1, Zone: "rxeveth0"},
	} {
		if d := bootstrapDevice(ts, a); d != "rxe1:1" {
			t.Errorf("bootstrapDevice(%v) = %q, want rxe1:1", a, d)
		}
	}
	if d := bootstrapDevice(ts, &net.TCPAddr{IP: net.ParseIP("10.78.0.2")}); d != "" {
		t.Errorf("bootstrapDevice(10.78.0.2) = %q, want none", d)
	}
}
