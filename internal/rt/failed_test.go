package rt

import (
	"errors"
	"testing"

	"github.com/gouct/gouct/uct"
)

// failingIface is an iface that reports itself failed for good (an RDMA
// device removed); only Failed is called.
type failingIface struct {
	uct.Iface
	err error
}

func (f failingIface) Failed() error { return f.err }

// A transport whose iface failed is no longer allowed (offered, selected);
// the others are.
func TestAllowedSkipsFailed(t *testing.T) {
	gone := errors.New("device removed")
	mk := func(tl string, err error) *Transport {
		return &Transport{TI: &uct.TLIface{Component: "c", Resource: uct.TLResource{TL: tl, Device: tl + "0"},
			Iface: failingIface{err: err}}}
	}
	r := &Runtime{Transports: []*Transport{mk("a", nil), mk("b", gone), mk("c", nil)}}
	got := Offered(r.Allowed(uct.DefaultConfig()), false)
	if got != "a/a0,c/c0" {
		t.Errorf("allowed %q, want a/a0,c/c0", got)
	}
	if err := r.Transports[1].Failed(); !errors.Is(err, gone) {
		t.Errorf("Failed: %v", err)
	}
}

// The registration counters are published in the expvar map.
func TestRegistrationVars(t *testing.T) {
	for _, k := range []string{"registrations_live", "registrations_total", "registered_allocs", "registered_slabs"} {
		if vars.Get(k) == nil {
			t.Errorf("expvar rdmanet.%s missing", k)
		}
	}
	c := ReadCounters()
	if c.RegistrationsLive < 0 || c.RegistrationsTotal < c.RegistrationsLive {
		t.Errorf("registrations: %+v", c)
	}
}
