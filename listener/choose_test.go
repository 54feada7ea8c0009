package listener

import (
	"errors"
	"net"
	"testing"

	"github.com/gouct/gouct/internal/rt"
	"github.com/gouct/gouct/uct"
)

// reachIface is a uct.Iface whose IsReachable answers from a set of peer
// device addresses; choose and uct.Select call nothing else.
type reachIface struct {
	uct.Iface // nil
	reach     map[string]bool
}

func (f *reachIface) IsReachable(devAddr, ifaceAddr []byte) bool { return f.reach[string(devAddr)] }

// local is an iface of tl on dev with latency lat that reaches the peer
// device addresses in reach.
func local(tl, dev string, lat float64, reach ...string) *uct.TLIface {
	typ := uct.DeviceNet
	if tl == "shm" {
		typ = uct.DeviceShm
	}
	f := &reachIface{reach: map[string]bool{}}
	for _, r := range reach {
		f.reach[r] = true
	}
	return &uct.TLIface{Component: tl, Resource: uct.TLResource{TL: tl, Device: dev, Type: typ},
		Iface: f, Attr: uct.IfaceAttr{Latency: uct.LinearFunc{C: lat}}}
}

// TestChoose: rc_verbs on the device of the bootstrap IP when it reaches
// the peer, uct.Select's ranking otherwise; the peer address is the first
// reachable one in the Hello's order.
func TestChoose(t *testing.T) {
	// Peer device addresses are named after the peer's device.
	rxe0 := local("rc_verbs", "rxe0:1", 15e-6, "p-rxe0")
	rxe1 := local("rc_verbs", "rxe1:1", 15e-6, "p-rxe0", "p-rxe1", "p-rxe2")
	rxe2 := local("rc_verbs", "rxe2:1", 15e-6, "p-rxe1", "p-rxe2")
	lone := local("rc_verbs", "rxe3:1", 15e-6) // reaches nothing
	shm := local("shm", "memory", 1e-7, "p-shm")
	fast := local("rc_verbs", "mlx5_0:1", 1e-6, "p-rxe0", "p-rxe2")
	pa := func(tl, dev string) uct.TLAddress {
		return uct.TLAddress{TL: tl, Device: dev, DevAddr: []byte("p-" + dev)}
	}
	// The client lists its device for the bootstrap IP first.
	rcPeer := []uct.TLAddress{pa("rc_verbs", "rxe2"), pa("rc_verbs", "rxe0"), pa("rc_verbs", "rxe1")}
	for _, tc := range []struct {
		name     string
		usable   []*uct.TLIface
		peer     []uct.TLAddress
		dev      string
		want     *uct.TLIface
		wantPeer string // DevAddr of the peer address chosen
	}{
		{"no device: uct.Select", []*uct.TLIface{rxe0, rxe1, rxe2}, rcPeer, "", rxe0, "p-rxe0"},
		{"device of the IP", []*uct.TLIface{rxe0, rxe1, rxe2}, rcPeer, "rxe1:1", rxe1, "p-rxe2"},
		{"device of the IP, Select's choice already", []*uct.TLIface{rxe0, rxe1, rxe2}, rcPeer, "rxe0:1", rxe0, "p-rxe0"},
		{"device of the IP, last", []*uct.TLIface{rxe0, rxe1, rxe2}, rcPeer, "rxe2:1", rxe2, "p-rxe2"},
		{"peer's first reachable address", []*uct.TLIface{rxe0, rxe1, rxe2},
			[]uct.TLAddress{pa("rc_verbs", "rxe1"), pa("rc_verbs", "rxe2")}, "rxe2:1", rxe2, "p-rxe1"},
		{"device reaches nothing: fallback", []*uct.TLIface{rxe0, lone}, rcPeer, "rxe3:1", rxe0, "p-rxe0"},
		{"device not usable: fallback", []*uct.TLIface{rxe0, rxe2}, rcPeer, "rxe1:1", rxe0, "p-rxe0"},
		{"unknown device: fallback", []*uct.TLIface{rxe0, rxe1}, rcPeer, "mlx5_1:1", rxe0, "p-rxe0"},
		{"faster device ranked first still yields", []*uct.TLIface{fast, rxe1}, rcPeer, "rxe1:1", rxe1, "p-rxe2"},
		{"faster device without match", []*uct.TLIface{rxe1, fast}, rcPeer, "", fast, "p-rxe2"},
		{"shm for a peer of this host", []*uct.TLIface{rxe1, shm},
			append([]uct.TLAddress{pa("shm", "shm")}, rcPeer...), "rxe1:1", shm, "p-shm"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ti, got, err := choose(tc.usable, tc.peer, tc.dev)
			if err != nil {
				t.Fatal(err)
			}
			if ti != tc.want || string(got.DevAddr) != tc.wantPeer {
				t.Errorf("choose(dev %q) = %s with peer %s, want %s with peer %s",
					tc.dev, ti.Name(), got.DevAddr, tc.want.Name(), tc.wantPeer)
			}
		})
	}
	t.Run("unreachable", func(t *testing.T) {
		for _, dev := range []string{"", "rxe3:1"} {
			if ti, _, err := choose([]*uct.TLIface{lone}, rcPeer, dev); !errors.Is(err, uct.ErrUnreachable) {
				t.Errorf("dev %q: choose = %v, %v; want ErrUnreachable", dev, ti, err)
			}
		}
	})
}

// TestBootstrapDevice: the device of the socket's IP when there is an
// rc_verbs transport (rt.DeviceForAddr, tested in rt, decides the rest);
// none, without scanning devices, when there is not.
func TestBootstrapDevice(t *testing.T) {
	calls := rt.FakeDevicesForTest(t, map[string]string{"10.78.0.1": "rxe1:1"})
	a := &net.TCPAddr{IP: net.ParseIP("10.78.0.1"), Port: 1}
	if d := bootstrapDevice([]*uct.TLIface{local("rc_verbs", "rxe1:1", 15e-6), local("shm", "memory", 1e-7)}, a); d != "rxe1:1" {
		t.Errorf("with rc_verbs: bootstrapDevice = %q, want rxe1:1", d)
	}
	if d := bootstrapDevice([]*uct.TLIface{local("shm", "memory", 1e-7)}, a); d != "" || *calls != 1 {
		t.Errorf("without rc_verbs: bootstrapDevice = %q after %d lookups, want none after 1", d, *calls)
	}
}
