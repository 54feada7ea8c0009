package rt

import (
	"context"
	"expvar"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/gouct/gouct/internal/stream"
	"github.com/gouct/gouct/uct"
	"github.com/gouct/gouct/uct/ib"
)

// Process-wide counters, published once as the expvar.Map "rdmanet"
// (/debug/vars when the program serves expvar). Keys:
//
//	conns_open          map transport → conns open now (Dial and Accept, TCP fallback included)
//	conns_total         map transport → conns ever started
//	fallbacks           map reason → conns that fell back to raw TCP
//	handshake_failures  map side ("dial", "accept") → handshakes that failed
//	resets              conns that ended in a reset (local abort, peer reset
//	                    or death, endpoint failure) rather than a clean close
//	bytes_read          application bytes read, closed and open conns
//	bytes_written       application bytes written, closed and open conns
//	registrations_live  RDMA memory registrations of caller memory alive now
//	                    (rendezvous buffers, per operation): back to its
//	                    baseline when every conn is closed
//	registrations_total RDMA memory registrations of caller memory ever made
//	registered_allocs   registered library buffers alive (MD.MemAlloc: the
//	                    bounded rendezvous staging pools)
//	registered_slabs    registered buffer-pool slabs of the open ifaces
//	cpu_pressure        host CPU pressure last sampled, per mille of time
//	                    runnable tasks waited for a CPU (uct.CPUPressure)
//	spin_miss           per mille of recent spins that ended without their event
//	polling_off         1 while waiters park at once instead of polling (both high)
//
// Counters change once per conn event, never per message: the byte totals
// are summed from the conns' own counters when read.
var (
	vars        = expvar.NewMap("rdmanet")
	connsOpen   = new(expvar.Map).Init()
	connsTotal  = new(expvar.Map).Init()
	fallbacks   = new(expvar.Map).Init()
	hsFailures  = new(expvar.Map).Init()
	resets      = new(expvar.Int)
	closedRead  atomic.Uint64
	closedWrite atomic.Uint64

	liveMu sync.Mutex
	live   = map[Conn]struct{}{}
)

func init() {
	vars.Set("conns_open", connsOpen)
	vars.Set("conns_total", connsTotal)
	vars.Set("fallbacks", fallbacks)
	vars.Set("handshake_failures", hsFailures)
	vars.Set("resets", resets)
	vars.Set("bytes_read", expvar.Func(func() any { r, _ := liveBytes(); return r }))
	vars.Set("bytes_written", expvar.Func(func() any { _, w := liveBytes(); return w }))
	vars.Set("registrations_live", expvar.Func(func() any { return ib.Registrations().Live }))
	vars.Set("registrations_total", expvar.Func(func() any { return ib.Registrations().Total }))
	vars.Set("registered_allocs", expvar.Func(func() any { return ib.Registrations().Allocs }))
	vars.Set("registered_slabs", expvar.Func(func() any { return ib.Registrations().Slabs }))
	vars.Set("cpu_pressure", expvar.Func(func() any { p, _, _ := uct.CPUPressure(); return p }))
	vars.Set("spin_miss", expvar.Func(func() any { _, m, _ := uct.CPUPressure(); return m }))
	vars.Set("polling_off", expvar.Func(func() any {
		if _, _, off := uct.CPUPressure(); off {
			return 1
		}
		return 0
	}))
}

// Counters is a snapshot of the process-wide counters (see the expvar map
// "rdmanet"). Maps are fresh copies the caller owns; keys with a zero value
// may be present.
type Counters struct {
	ConnsOpen         map[string]int64 // by transport
	ConnsTotal        map[string]int64 // by transport
	Fallbacks         map[string]int64 // by reason
	HandshakeFailures map[string]int64 // by side: "dial", "accept"
	Resets            int64
	BytesRead         uint64
	BytesWritten      uint64
	// RDMA memory registrations (uct/ib, every device): registrations of
	// caller memory (per operation) alive now and ever made, live
	// registered library buffers (MemAlloc), live buffer-pool slabs.
	RegistrationsLive, RegistrationsTotal, RegisteredAllocs, RegisteredSlabs int64
}

// Open is the number of conns open now, every transport.
func (c Counters) Open() int64 {
	var n int64
	for _, v := range c.ConnsOpen {
		n += v
	}
	return n
}

// ReadCounters returns a snapshot of the counters. Safe from any goroutine.
func ReadCounters() Counters {
	read := func(m *expvar.Map) map[string]int64 {
		out := map[string]int64{}
		m.Do(func(kv expvar.KeyValue) {
			if v, ok := kv.Value.(*expvar.Int); ok {
				out[kv.Key] = v.Value()
			}
		})
		return out
	}
	r, w := liveBytes()
	reg := ib.Registrations()
	return Counters{ConnsOpen: read(connsOpen), ConnsTotal: read(connsTotal), Fallbacks: read(fallbacks),
		HandshakeFailures: read(hsFailures), Resets: resets.Value(), BytesRead: r, BytesWritten: w,
		RegistrationsLive: reg.Live, RegistrationsTotal: reg.Total, RegisteredAllocs: reg.Allocs,
		RegisteredSlabs: reg.Slabs}
}

func liveBytes() (r, w uint64) {
	liveMu.Lock()
	defer liveMu.Unlock()
	r, w = closedRead.Load(), closedWrite.Load()
	for c := range live {
		st := c.Stats()
		r += st.BytesRead
		w += st.BytesWritten
	}
	return r, w
}

// opened records c as open (conns_open, conns_total).
func opened(c Conn, transport string) {
	liveMu.Lock()
	live[c] = struct{}{}
	liveMu.Unlock()
	connsOpen.Add(transport, 1)
	connsTotal.Add(transport, 1)
}

// closed records the end of c, once: its bytes move to the closed totals.
func closed(c Conn, transport string) {
	st := c.Stats()
	liveMu.Lock()
	if _, ok := live[c]; !ok {
		liveMu.Unlock()
		return
	}
	delete(live, c)
	closedRead.Add(st.BytesRead)
	closedWrite.Add(st.BytesWritten)
	liveMu.Unlock()
	connsOpen.Add(transport, -1)
}

// HandshakeFailed counts a failed handshake on side "dial" or "accept".
func HandshakeFailed(side string) { hsFailures.Add(side, 1) }

// countingCtl is the liveness socket as handed to a stream conn: it records
// the conn's end when the stream closes it, and a reset when the stream's
// last notice on it is a reset (the stream writes exactly one notice, just
// before closing, and nothing else). Its Reads wait for the gate, so that
// the handshake can still read its last frame after the stream started.
type countingCtl struct {
	*net.TCPConn
	sc        *stream.Conn
	transport string
	log       *slog.Logger
	reset     atomic.Bool
	once      sync.Once
	gate      chan struct{}
	gateOnce  sync.Once
}

func (c *countingCtl) Read(p []byte) (int, error) {
	<-c.gate
	return c.TCPConn.Read(p)
}

func (c *countingCtl) Write(p []byte) (int, error) {
	if len(p) == 1 && p[0] == 'R' && !c.reset.Swap(true) {
		resets.Add(1)
		c.log.Info("rdmanet: conn reset", "transport", c.transport,
			"local", c.sc.LocalAddr().String(), "remote", c.sc.RemoteAddr().String())
	}
	return c.TCPConn.Write(p)
}

func (c *countingCtl) Close() error {
	c.once.Do(func() { closed(c.sc, c.transport) })
	err := c.TCPConn.Close()
	c.open()
	return err
}

func (c *countingCtl) open() { c.gateOnce.Do(func() { close(c.gate) }) }

// StartStream starts sc on ep with the bootstrap socket tc as its liveness
// channel (stream.Conn.Start) and records it in the counters until the
// stream closes tc. The stream does not read tc until the caller calls
// watch (the handshake may still read from tc meanwhile; writing is fine).
// Start clears tc's deadlines. On error ep and tc remain the caller's,
// uncounted; after success, a failed handshake aborts sc (which closes tc).
//
// Both sides start their stream before the last handshake message leaves
// (the client before its Ready, the server before its Ready), so that no
// stream message can reach a conn that has not started.
func StartStream(sc *stream.Conn, ep uct.EP, peerID uint32, tc *net.TCPConn, log *slog.Logger) (watch func(), err error) {
	ctl := &countingCtl{TCPConn: tc, sc: sc, transport: sc.Transport(), log: log, gate: make(chan struct{})}
	opened(sc, ctl.transport)
	if err := sc.Start(ep, peerID, ctl, Addr(tc.LocalAddr()), Addr(tc.RemoteAddr())); err != nil {
		ctl.once.Do(func() { closed(sc, ctl.transport) })
		return nil, err
	}
	return ctl.open, nil
}

// Logger returns the library's logger for cfg: slog.Default's handler,
// filtered to cfg.LogLevel (RDMANET_LOG_LEVEL: debug, info, warn, error,
// off; default and unknown values: warn). The library logs conn and
// handshake events (failures, fallbacks, resets), never per message.
func Logger(cfg *uct.Config) *slog.Logger {
	var min slog.Level
	switch strings.ToLower(strings.TrimSpace(cfg.LogLevel)) {
	case "debug", "trace":
		min = slog.LevelDebug
	case "info":
		min = slog.LevelInfo
	case "error":
		min = slog.LevelError
	case "none", "off":
		min = slog.LevelError + 100
	default:
		min = slog.LevelWarn
	}
	return slog.New(&levelHandler{min: min, h: slog.Default().Handler()})
}

// levelHandler passes records at or above min to h (slog.Default's handler
// when the logger was made).
type levelHandler struct {
	min slog.Level
	h   slog.Handler
}

func (h *levelHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.h.Enabled(ctx, l)
}

func (h *levelHandler) Handle(ctx context.Context, r slog.Record) error { return h.h.Handle(ctx, r) }

func (h *levelHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &levelHandler{min: h.min, h: h.h.WithAttrs(as)}
}

func (h *levelHandler) WithGroup(name string) slog.Handler {
	return &levelHandler{min: h.min, h: h.h.WithGroup(name)}
}
