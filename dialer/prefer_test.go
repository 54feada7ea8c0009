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

// TestBootstrapDevice: the device of the socket's IP when there is an
// rc_verbs transport (rt.DeviceForAddr, tested in rt, decides the rest);
// none, without scanning devices, when there is not.
func TestBootstrapDevice(t *testing.T) {
	calls := rt.FakeDevicesForTest(t, map[string]string{"10.78.0.1": "rxe1:1"})
	a := &net.TCPAddr{IP: net.ParseIP("10.78.0.1"), Port: 1}
	if d := bootstrapDevice([]*rt.Transport{tr("rc_verbs", "rxe1:1"), tr("shm", "memory")}, a); d != "rxe1:1" {
		t.Errorf("with rc_verbs: bootstrapDevice = %q, want rxe1:1", d)
	}
	if d := bootstrapDevice([]*rt.Transport{tr("shm", "memory")}, a); d != "" || *calls != 1 {
		t.Errorf("without rc_verbs: bootstrapDevice = %q after %d lookups, want none after 1", d, *calls)
	}
}
