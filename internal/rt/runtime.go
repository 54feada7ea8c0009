package rt

import (
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gouct/gouct/internal/stream"
	"github.com/gouct/gouct/uct"

	// Transports, registered for their side effect. The uct "tcp"
	// transport is never opened here: the raw TCP fallback replaces it.
	_ "github.com/gouct/gouct/uct/self"
)

// Transport is one opened transport resource with its stream multiplexer.
type Transport struct {
	TI  *uct.TLIface
	Mux *stream.Mux

	failLogged atomic.Bool
}

// Name is how conns report the transport: the TL name for host-local
// transports ("shm", "self"), "tl/device" for network devices
// ("rc_verbs/rxe0:1").
func (t *Transport) Name() string { return TransportName(t.TI.Resource) }

// TransportName formats r as Transport.Name does.
func TransportName(r uct.TLResource) string {
	if r.Type == uct.DeviceNet {
		return r.Name()
	}
	return r.TL
}

// HostLocal reports whether the transport only reaches this host (shm, self).
func (t *Transport) HostLocal() bool { return t.TI.Resource.Type != uct.DeviceNet }

// Runtime is the process-wide transport state: one worker, its ifaces and
// their muxes. It lives as long as the process; every method is safe for
// concurrent use, and the fields are read-only after Get.
type Runtime struct {
	Worker     *uct.Worker
	Ifaces     *uct.Ifaces
	Transports []*Transport
	// Skipped lists resources not opened and why (for logs and rdmanet-info).
	Skipped []error
	// Log is the library's logger (RDMANET_LOG_LEVEL of the first
	// configuration).
	Log *slog.Logger
}

var (
	rtOnce sync.Once
	rtInst *Runtime
)

// Get returns the runtime, opening it on first use with cfg (already
// resolved; see Resolve). Worker and iface tuning (progress spin, shm FIFO,
// IB queues, receive window) therefore come from the first Listen or Dial's
// configuration; the transport list (TLS) of each Listen and Dial restricts
// the candidates per connection, so every allowed transport except uct's
// "tcp" is opened here.
func Get(cfg *uct.Config) *Runtime {
	rtOnce.Do(func() { rtInst = open(cfg) })
	return rtInst
}

func open(cfg *uct.Config) *Runtime {
	c := *cfg
	c.TLS = []string{"^tcp"}
	log := Logger(&c)
	w := uct.NewWorker(&c)
	// An endpoint that fails asynchronously (an RC QP in the error state, a
	// shm peer gone) resets its conn at once instead of at the next send.
	// The handler runs on the worker; the muxes exist once OpenIfaces
	// returns, and an endpoint exists only after that.
	var muxes atomic.Pointer[[]*stream.Mux]
	onErr := func(ep uct.EP, err error) {
		log.Info("rdmanet: endpoint failed", "err", err)
		if ms := muxes.Load(); ms != nil {
			for _, m := range *ms {
				m.EndpointFailed(ep, err)
			}
		}
	}
	ifs := uct.OpenIfaces(w, &c, uct.IfaceParams{Config: &c, ErrHandler: onErr})
	r := &Runtime{Worker: w, Ifaces: ifs, Skipped: ifs.Skipped, Log: log}
	var ms []*stream.Mux
	for _, ti := range ifs.List {
		mc := &c
		// A transport whose events wake a parked reader slowly asks for a
		// longer Read spin (IfaceAttr.MinSpin); 0 (disabled) stays 0.
		if spin := time.Duration(ti.Attr.MinSpin * float64(time.Second)); c.ReadSpin > 0 && spin > c.ReadSpin {
			cc := c
			cc.ReadSpin = spin
			mc = &cc
		}
		m, err := stream.NewMux(w, ti, mc)
		if err != nil {
			log.Warn("rdmanet: transport not usable", "transport", ti.Name(), "err", err)
			r.Skipped = append(r.Skipped, err)
			continue
		}
		ms = append(ms, m)
		r.Transports = append(r.Transports, &Transport{TI: ti, Mux: m})
	}
	muxes.Store(&ms)
	for _, err := range ifs.Skipped {
		log.Debug("rdmanet: transport skipped", "err", err)
	}
	return r
}

// Allowed returns the transports cfg allows, in the runtime's order,
// leaving out those whose iface failed for good (Failed).
func (r *Runtime) Allowed(cfg *uct.Config) []*Transport {
	var out []*Transport
	for _, t := range r.Transports {
		if !cfg.TLAllowed(t.TI.Component, t.TI.Resource.TL) {
			continue
		}
		if err := t.Failed(); err != nil {
			if !t.failLogged.Swap(true) && r.Log != nil {
				r.Log.Warn("rdmanet: transport failed, no longer offered", "transport", t.Name(), "err", err)
			}
			continue
		}
		out = append(out, t)
	}
	return out
}

// FailedSummary names the transports cfg allows whose iface failed for
// good, with why ("rc_verbs/rxe0:1: device rxe0 removed; ..."), or "" when
// none did: the detail of a fallback that happened because of them.
func (r *Runtime) FailedSummary(cfg *uct.Config) string {
	var parts []string
	for _, t := range r.Transports {
		if !cfg.TLAllowed(t.TI.Component, t.TI.Resource.TL) {
			continue
		}
		if err := t.Failed(); err != nil {
			parts = append(parts, t.Name()+": "+err.Error())
		}
	}
	return strings.Join(parts, "; ")
}

// failer is implemented by ifaces that can fail for good: an rc_verbs
// iface whose RDMA device was removed or hit a fatal error.
type failer interface{ Failed() error }

// Failed returns why the transport's iface is unusable for good (its
// device was removed), nil while it works: the wireup then stops offering
// and selecting it, and new conns use another transport (or the TCP
// fallback). Safe for concurrent use.
func (t *Transport) Failed() error {
	if f, ok := t.TI.Iface.(failer); ok {
		return f.Failed()
	}
	return nil
}

// Offered lists the names of ts, plus "tcp" when tcp is true, for errors.
func Offered(ts []*Transport, tcp bool) string {
	var names []string
	for _, t := range ts {
		names = append(names, t.Name())
	}
	if tcp {
		names = append(names, "tcp")
	}
	if len(names) == 0 {
		return "nothing"
	}
	return strings.Join(names, ",")
}
