package stream

import (
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/gouct/gouct/uct"
)

// Mux binds the stream's active-message handlers on one opened transport
// interface and routes incoming messages to conns by the conn id carried in
// every message. One Mux per iface (the handlers are per iface). Methods are
// safe for concurrent use.
type Mux struct {
	w      *uct.Worker
	ti     *uct.TLIface
	cfg    *uct.Config
	attr   uct.IfaceAttr
	mdAttr uct.MDAttr

	transport  string
	maxShort   int // largest AMShort payload (header excluded); -1 without AMShort
	maxFrag    int // largest DATA payload per message
	rndvThresh int // Write size from which rendezvous is used; 0: never
	maxRndv    int // largest rendezvous (the MD's largest registration); 0: no limit
	directMin  int // Read size from which a rendezvous pull lands in the Read buffer
	window     int
	keepSpin   bool // the iface's events wake waiters slowly: poll even under CPU pressure

	chunks chunkPool
	stages stagePool

	mu     sync.RWMutex
	conns  map[uint32]*Conn
	nextID uint32
	closed bool
}

// NewMux installs the stream handlers on ti (progressed by w). cfg nil means
// w's configuration. The iface needs AMShort or AMBcopy, and a connect mode.
func NewMux(w *uct.Worker, ti *uct.TLIface, cfg *uct.Config) (*Mux, error) {
	if cfg == nil {
		cfg = w.Config()
	}
	a := ti.Attr
	m := &Mux{w: w, ti: ti, cfg: cfg, attr: a, mdAttr: ti.MD.Attr(), conns: map[uint32]*Conn{}}
	m.transport = ti.Resource.TL
	if ti.Resource.Type == uct.DeviceNet {
		m.transport = ti.Name()
	}
	m.maxShort = -1
	if a.Cap.Has(uct.CapAMShort) && a.MaxShort >= rstLen+4 {
		m.maxShort = a.MaxShort
	}
	switch {
	case a.Cap.Has(uct.CapAMBcopy) && a.MaxBcopy > hdrLen+rtsFixedLen+m.mdAttr.RKeySize:
		m.maxFrag = a.MaxBcopy - hdrLen
	case m.maxShort > 0:
		m.maxFrag = m.maxShort
	default:
		return nil, fmt.Errorf("stream: %s: %w", ti.Name(), uct.NotSupported("active messages (am_short or am_bcopy)"))
	}
	m.window = min(max(cfg.RxWindow, initialCredit), 1<<30)
	m.keepSpin = a.MinSpin > 0
	m.rndvThresh = rndvThreshold(cfg, a, m.mdAttr, m.maxFrag, ti.Resource.Type)
	m.directMin = max(m.rndvThresh, 64<<10)
	if r := m.mdAttr.MaxReg; r > 0 && r < 1<<40 {
		m.maxRndv = int(r)
	}
	m.chunks.max = m.window / chunkSize * 2
	m.stages = stagePool{md: ti.MD, size: 256 << 10, max: 4}
	ids := []uint8{amData, amCredit, amRTS, amATS, amFIN, amRST}
	hs := []uct.AMHandler{m.onData, m.onCredit, m.onRTS, m.onATS, m.onFIN, m.onRST}
	for i, id := range ids {
		if err := ti.Iface.SetAMHandler(id, hs[i]); err != nil {
			for _, j := range ids[:i] {
				ti.Iface.SetAMHandler(j, nil)
			}
			return nil, fmt.Errorf("stream: %s: set am handler %d: %w", ti.Name(), id, err)
		}
	}
	return m, nil
}

// rndvThreshold is cfg.RndvThresh, or, when 0, the write size where pulling
// from a registered buffer beats copying through bounce buffers: the
// registration cost plus an RTS/ATS round trip against the copy time at the
// iface's bandwidth, clamped to [64 KiB, 256 KiB]. 0 (never) without GetZcopy.
//
// Shared memory is the exception (shmRndvThresh): there a get is a copy by
// the reader's CPU, no faster than the copy out of the ring, and it is not
// pipelined with the writer, which sleeps through it and pays a wake-up.
func rndvThreshold(cfg *uct.Config, a uct.IfaceAttr, md uct.MDAttr, maxFrag int, dev uct.DeviceType) int {
	if !a.Cap.Has(uct.CapGetZcopy) || a.MaxGet <= 0 || md.RKeySize > maxRKeyLen {
		return 0
	}
	if cfg.RndvThresh > 0 {
		return max(cfg.RndvThresh, maxFrag+1)
	}
	if dev == uct.DeviceShm {
		return max(shmRndvThresh, maxFrag+1)
	}
	bw := a.Bandwidth.Total(1)
	if bw <= 0 {
		bw = 1e9
	}
	fixed := md.RegCost.C + 2*(a.Latency.C+a.Overhead)
	t := 64 << 10
	if d := 1 - md.RegCost.M*bw; d > 0 {
		if x := fixed * bw / d; x < math.MaxInt32 {
			t = int(x)
		} else {
			t = 256 << 10
		}
	} else {
		t = 256 << 10
	}
	return max(min(max(t, 64<<10), 256<<10), maxFrag+1)
}

// shmRndvThresh is the rendezvous threshold of shared-memory transports.
// Pipelined bcopy streams through the ring with both sides busy, while a
// rendezvous leaves the writer idle through a pull that outlasts its spin
// (ReadSpin), so it parks and pays a wake-up (DESIGN.md "Calibration":
// 64-95 µs) per Write. Measured two-process (rdmanet-perf stream_lat):
// 64 KiB 158 µs with rendezvous against 5 µs with bcopy, 256 KiB 282 against
// 23 µs. From a few MiB on the wake-up is a small part of the pull, and
// the single copy saves CPU.
const shmRndvThresh = 4 << 20

// TLIface is the transport this Mux runs on.
func (m *Mux) TLIface() *uct.TLIface { return m.ti }

// RndvThreshold is the Write size from which conns of this Mux use
// rendezvous (0: never).
func (m *Mux) RndvThreshold() int { return m.rndvThresh }

// NewConn allocates a conn with a fresh local id. Messages addressed to it
// that arrive before Start are buffered (bounded by the receive window).
func (m *Mux) NewConn() (*Conn, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, fmt.Errorf("stream: new conn: %w", uct.ErrClosed)
	}
	for {
		m.nextID++
		if m.nextID != 0 && m.conns[m.nextID] == nil {
			break
		}
	}
	c := newConn(m, m.nextID)
	m.conns[c.id] = c
	return c, nil
}

// Close resets every conn of this Mux (RST to their peers, blocked calls
// fail) and removes the handlers. The iface itself belongs to the caller.
func (m *Mux) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	cs := make([]*Conn, 0, len(m.conns))
	for _, c := range m.conns {
		cs = append(cs, c)
	}
	m.mu.Unlock()
	for _, c := range cs {
		c.abort(rstMuxClosed, fmt.Errorf("stream: %w", uct.ErrClosed))
	}
	for _, id := range []uint8{amData, amCredit, amRTS, amATS, amFIN, amRST} {
		m.ti.Iface.SetAMHandler(id, nil)
	}
	m.stages.close()
	return nil
}

// EndpointFailed resets the conn whose endpoint is ep (blocked calls fail
// with ErrReset wrapping err). Wire it to uct.IfaceParams.ErrHandler: an
// endpoint that fails asynchronously (an RC QP in the error state) would
// otherwise only be noticed by the next send. Safe from any goroutine,
// the worker included; unknown endpoints are ignored.
func (m *Mux) EndpointFailed(ep uct.EP, err error) {
	m.mu.RLock()
	var hit *Conn
	for _, c := range m.conns {
		if c.hasEP(ep) {
			hit = c
			break
		}
	}
	m.mu.RUnlock()
	if hit != nil {
		hit.mu.Lock()
		hit.resetLocked(resetBy(false, rstAbort, fmt.Errorf("endpoint failed: %w", err)), 0)
		ctl := hit.ctl
		if hit.released {
			ctl = nil
		}
		hit.mu.Unlock()
		hit.wakeAll()
		if ctl != nil && hit.failNoticed.CompareAndSwap(false, true) {
			// No RST can cross a failed endpoint: tell the peer on the
			// liveness channel now (an idle peer would otherwise learn only
			// when the application closes this conn). Not on the worker:
			// the write may block for up to ctlWriteTime.
			go func() {
				ctl.SetWriteDeadline(time.Now().Add(ctlWriteTime))
				ctl.Write([]byte{noticeReset})
			}()
		}
	}
}

func (m *Mux) remove(c *Conn) {
	m.mu.Lock()
	if m.conns[c.id] == c {
		delete(m.conns, c.id)
	}
	m.mu.Unlock()
}

// route finds the conn a message is for; nil drops it.
func (m *Mux) route(data []byte) (*Conn, uint32, []byte) {
	id, credit, body, ok := parseHdr(data)
	if !ok {
		return nil, 0, nil
	}
	m.mu.RLock()
	c := m.conns[id]
	m.mu.RUnlock()
	return c, credit, body
}

// Handlers: they run on the worker under its progress lock, never block,
// copy what they keep, and only hand off and signal.

func (m *Mux) onData(data []byte) {
	if c, credit, body := m.route(data); c != nil {
		c.recvData(credit, body)
	}
}

func (m *Mux) onCredit(data []byte) {
	if c, credit, body := m.route(data); c != nil {
		if len(body) != 0 {
			c.protocolError("CREDIT with a body")
			return
		}
		c.recvCredit(credit)
	}
}

func (m *Mux) onRTS(data []byte) {
	if c, credit, body := m.route(data); c != nil {
		r, err := parseRTS(body)
		if err != nil {
			c.protocolError("RTS: " + err.Error())
			return
		}
		c.recvRTS(credit, r)
	}
}

func (m *Mux) onATS(data []byte) {
	if c, credit, body := m.route(data); c != nil {
		tok, ok := parseU32(body)
		if !ok {
			c.protocolError("ATS length")
			return
		}
		c.recvATS(credit, tok)
	}
}

func (m *Mux) onFIN(data []byte) {
	if c, credit, body := m.route(data); c != nil {
		if len(body) != 0 {
			c.protocolError("FIN with a body")
			return
		}
		c.recvFIN(credit)
	}
}

func (m *Mux) onRST(data []byte) {
	if c, _, body := m.route(data); c != nil {
		code, ok := parseU32(body)
		if !ok {
			code = rstProtocol
		}
		c.recvRST(code)
	}
}
