package tcp

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/gouct/gouct/uct"
)

const (
	// txLimit bounds what an EP queues (copies and zcopy references): a
	// send is admitted while less is queued, else it gets ErrNoResource.
	txLimit = 64 << 10
	// chunkSize: copies are kept in chunks of this size, recycled per EP.
	chunkSize  = 32 << 10
	freeChunks = 4
	maxWritev  = 1024 // IOV_MAX on Linux

	dialTimeout = 10 * time.Second

	// txEvents: an outgoing socket is always watched for the peer going
	// away (it never sends on it); evOut is added while data is queued.
	txEvents = evRdHup
)

type chunk struct {
	b    []byte // len: bytes handed out; cap: chunkSize
	live int    // handed-out bytes not yet written
}

// txComp fires when the queue has written up to off (a cumulative offset).
type txComp struct {
	off int64
	c   *uct.Completion
}

// txq is what an EP has to write, in order: copies (in chunks) and
// references to zcopy callers' buffers.
type txq struct {
	bufs    [][]byte
	owner   []*chunk // parallel to bufs: the chunk of a copy, nil for a reference
	cur     *chunk   // copies go here
	free    []*chunk
	open    bool // bufs' last element ends at len(cur.b) and may grow
	bytes   int
	head    int64 // cumulative bytes written
	tail    int64 // cumulative bytes queued
	comps   []txComp
	scratch []*uct.Completion
}

func (q *txq) newChunk() *chunk {
	if n := len(q.free); n > 0 {
		c := q.free[n-1]
		q.free = q.free[:n-1]
		return c
	}
	return &chunk{b: make([]byte, 0, chunkSize)}
}

func (q *txq) release(c *chunk) {
	c.b, c.live = c.b[:0], 0
	if c != q.cur && len(q.free) < freeChunks {
		q.free = append(q.free, c)
	}
}

// reserve appends n (<= chunkSize) bytes of copy space and returns them.
func (q *txq) reserve(n int) []byte {
	if q.cur == nil || cap(q.cur.b)-len(q.cur.b) < n {
		if q.cur != nil && q.cur.live == 0 {
			q.cur.b = q.cur.b[:0]
		} else {
			q.cur = q.newChunk()
		}
		q.open = false
	}
	c := q.cur
	start := len(c.b)
	c.b = c.b[:start+n]
	c.live += n
	if q.open {
		last := &q.bufs[len(q.bufs)-1]
		*last = (*last)[:len(*last)+n]
	} else {
		q.bufs = append(q.bufs, c.b[start:start+n])
		q.owner = append(q.owner, c)
		q.open = true
	}
	q.bytes += n
	q.tail += int64(n)
	return c.b[start : start+n : start+n]
}

// trim gives back the last k reserved bytes.
func (q *txq) trim(k int) {
	q.cur.b = q.cur.b[:len(q.cur.b)-k]
	q.cur.live -= k
	last := &q.bufs[len(q.bufs)-1]
	*last = (*last)[:len(*last)-k]
	q.bytes -= k
	q.tail -= int64(k)
}

// ref appends a caller's buffer without copying it.
func (q *txq) ref(b []byte) {
	if len(b) == 0 {
		return
	}
	q.bufs = append(q.bufs, b)
	q.owner = append(q.owner, nil)
	q.open = false
	q.bytes += len(b)
	q.tail += int64(len(b))
}

// consume drops the first n bytes, written to the socket.
func (q *txq) consume(n int) {
	q.head += int64(n)
	q.bytes -= n
	drop := 0
	for drop < len(q.bufs) && n > 0 {
		b := q.bufs[drop]
		k := min(n, len(b))
		n -= k
		if c := q.owner[drop]; c != nil {
			c.live -= k
			if c.live == 0 && c != q.cur {
				q.release(c)
			}
		}
		if k < len(b) {
			q.bufs[drop] = b[k:]
			break
		}
		drop++
	}
	if drop > 0 {
		k := copy(q.bufs, q.bufs[drop:])
		copy(q.owner, q.owner[drop:])
		clear(q.bufs[k:])
		clear(q.owner[k:])
		q.bufs, q.owner = q.bufs[:k], q.owner[:k]
	}
	q.open = false
	if q.cur != nil && q.cur.live == 0 {
		q.cur.b = q.cur.b[:0]
	}
}

// done moves the completions whose data is written to q.scratch.
func (q *txq) done() []*uct.Completion {
	q.scratch = q.scratch[:0]
	k := 0
	for k < len(q.comps) && q.comps[k].off <= q.head {
		q.scratch = append(q.scratch, q.comps[k].c)
		k++
	}
	if k > 0 {
		n := copy(q.comps, q.comps[k:])
		clear(q.comps[n:])
		q.comps = q.comps[:n]
	}
	return q.scratch
}

// ep is an endpoint: one outgoing TCP connection to a peer iface. Methods
// are safe for concurrent use. A pack function given to AMBcopy runs with
// the EP locked and must not call the EP.
//
// Sends write to the socket at once (non-blocking writev) when nothing is
// queued; what the socket does not take is queued, bounded by txLimit, and
// written by the worker's Progress when the poller says the socket is
// writable. Completions and pending requests run there too.
type ep struct {
	iface *iface
	addr  *net.TCPAddr

	mu       sync.Mutex
	q        txq
	raw      syscall.RawConn // nil until connected
	conn     *net.TCPConn
	fd       int
	backlog  bool  // the poller watches for writability
	err      error // why sends fail: closed, or the connection failed
	reported bool  // the failure went to ErrHandler and completions
	closed   bool

	cancel   context.CancelFunc
	dialDone chan struct{}

	pending uct.PendingQueue

	wbufs   [][]byte
	wn      int
	werr    error
	writeFn func(fd uintptr) bool
}

func newEP(i *iface, a *net.TCPAddr) *ep {
	ctx, cancel := context.WithCancel(context.Background())
	e := &ep{iface: i, addr: a, cancel: cancel, dialDone: make(chan struct{})}
	e.writeFn = e.doWrite
	copy(e.q.reserve(len(magic)), magic)
	go e.dial(ctx)
	return e
}

// dial connects, then lets Progress write what was queued meanwhile.
func (e *ep) dial(ctx context.Context) {
	defer close(e.dialDone)
	d := net.Dialer{Timeout: dialTimeout}
	c, err := d.DialContext(ctx, "tcp4", e.addr.String())
	if err != nil {
		e.fail(fmt.Errorf("tcp: connect %s: %v: %w", e.addr, err, uct.ErrUnreachable))
		return
	}
	conn := c.(*net.TCPConn)
	raw, err := conn.SyscallConn()
	if err != nil {
		conn.Close()
		e.fail(fmt.Errorf("tcp: connect %s: %v: %w", e.addr, err, uct.ErrEndpointReset))
		return
	}
	fd := -1
	raw.Control(func(f uintptr) { fd = int(f) })
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		conn.Close()
		return
	}
	e.conn, e.raw, e.fd = conn, raw, fd
	e.backlog = true // the magic at least is queued
	e.mu.Unlock()
	if err := e.iface.attach(fd, e, txEvents|evOut); err != nil {
		e.fail(err)
		return
	}
	e.iface.w.Wake()
}

// fail records an asynchronous failure; Progress reports it on the worker.
func (e *ep) fail(err error) {
	e.mu.Lock()
	if e.err == nil {
		e.err = err
	}
	e.mu.Unlock()
	e.iface.w.Post(func() { e.progress(0) })
}

// admit reports why a send cannot be queued now (e.mu held).
func (e *ep) admit() error {
	if e.err != nil {
		return e.err
	}
	if e.q.bytes >= txLimit {
		return uct.ErrNoResource
	}
	return nil
}

// doWrite is one non-blocking writev of e.wbufs (raw.Write callback: never waits).
func (e *ep) doWrite(fd uintptr) bool {
	e.wn, e.werr = writev(int(fd), e.wbufs)
	return true
}

// flush writes what the socket takes now (e.mu held). It reports whether
// the queue is empty afterwards.
func (e *ep) flush() bool {
	if e.raw == nil || e.err != nil {
		return e.q.bytes == 0
	}
	for e.q.bytes > 0 {
		e.wbufs = e.q.bufs[:min(len(e.q.bufs), maxWritev)]
		want := e.q.bytes
		if len(e.wbufs) < len(e.q.bufs) {
			want = 0
			for _, b := range e.wbufs {
				want += len(b)
			}
		}
		e.wn, e.werr = 0, nil
		if err := e.raw.Write(e.writeFn); err != nil && e.werr == nil {
			e.werr = err
		}
		e.wbufs = nil
		if e.wn > 0 {
			e.q.consume(e.wn)
		}
		if e.werr != nil {
			if e.werr != syscall.EAGAIN && e.werr != syscall.EINTR {
				e.err = fmt.Errorf("tcp: write to %s: %v: %w", e.addr, e.werr, uct.ErrEndpointReset)
				e.setBacklog(true) // Progress reports the failure
			}
			return false
		}
		if e.wn < want {
			return e.q.bytes == 0 // the socket is full: no point asking again now
		}
	}
	return true
}

// setBacklog makes the poller watch (or stop watching) writability (e.mu held).
func (e *ep) setBacklog(on bool) {
	if e.backlog == on || e.raw == nil {
		return
	}
	ev := uint32(txEvents)
	if on {
		ev |= evOut
	}
	if e.iface.poll.mod(e.fd, ev) == nil {
		e.backlog = on
	}
}

// sent writes a newly queued send when nothing was waiting before it (e.mu
// held). It reports whether everything is written.
func (e *ep) sent(wasEmpty bool) bool {
	if wasEmpty && !e.backlog && e.flush() {
		return true
	}
	e.setBacklog(true)
	return false
}

func (e *ep) AMShort(id uint8, hdr uint64, payload []byte) error {
	if id >= uct.MaxAMID {
		return fmt.Errorf("tcp: am id %d: %w", id, uct.ErrInvalidParam)
	}
	if len(payload) > maxShort {
		return fmt.Errorf("tcp: am short of %d bytes (max %d): %w", len(payload), maxShort, uct.ErrMessageSize)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.admit(); err != nil {
		return err
	}
	was := e.q.bytes == 0
	b := e.q.reserve(frameHdr + 8 + len(payload))
	b[0] = id
	binary.LittleEndian.PutUint32(b[1:], uint32(8+len(payload)))
	binary.LittleEndian.PutUint64(b[frameHdr:], hdr)
	copy(b[frameHdr+8:], payload)
	e.sent(was)
	return nil
}

func (e *ep) AMBcopy(id uint8, pack func(buf []byte) int) (int, error) {
	if id >= uct.MaxAMID {
		return 0, fmt.Errorf("tcp: am id %d: %w", id, uct.ErrInvalidParam)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.admit(); err != nil {
		return 0, err
	}
	was := e.q.bytes == 0
	b := e.q.reserve(frameHdr + maxBcopy)
	n := pack(b[frameHdr:])
	if n < 0 || n > maxBcopy {
		e.q.trim(frameHdr + maxBcopy)
		return 0, fmt.Errorf("tcp: pack wrote %d bytes of %d: %w", n, maxBcopy, uct.ErrMessageSize)
	}
	e.q.trim(maxBcopy - n)
	b[0] = id
	binary.LittleEndian.PutUint32(b[1:], uint32(n))
	e.sent(was)
	return n, nil
}

// AMZcopy writes header and iov with one writev when the socket has room;
// otherwise the rest stays referenced (not copied) until Progress has
// written it, and comp fires then.
func (e *ep) AMZcopy(id uint8, header []byte, iov []uct.IOV, comp *uct.Completion) error {
	if id >= uct.MaxAMID {
		return fmt.Errorf("tcp: am id %d: %w", id, uct.ErrInvalidParam)
	}
	n := uct.IOVLen(iov)
	if len(header) > maxHeader || len(iov) > maxIOV || n > maxZcopy {
		return fmt.Errorf("tcp: am zcopy header %d, %d iovs, %d bytes (max %d, %d, %d): %w",
			len(header), len(iov), n, maxHeader, maxIOV, maxZcopy, uct.ErrMessageSize)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.admit(); err != nil {
		return err
	}
	was := e.q.bytes == 0
	b := e.q.reserve(frameHdr + len(header))
	b[0] = id
	binary.LittleEndian.PutUint32(b[1:], uint32(len(header)+n))
	copy(b[frameHdr:], header)
	for _, v := range iov {
		e.q.ref(v.Buf)
	}
	if e.sent(was) || n == 0 {
		return nil
	}
	e.q.comps = append(e.q.comps, txComp{off: e.q.tail, c: comp})
	return uct.ErrInProgress
}

func (e *ep) PutZcopy(iov []uct.IOV, raddr uint64, rkey []byte, comp *uct.Completion) error {
	return uct.NotSupported("tcp: put_zcopy")
}

func (e *ep) GetZcopy(iov []uct.IOV, raddr uint64, rkey []byte, comp *uct.Completion) error {
	return uct.NotSupported("tcp: get_zcopy")
}

// Flush: nil when everything sent is written to the socket; else comp
// fires once it is.
func (e *ep) Flush(comp *uct.Completion) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.err != nil {
		return e.err
	}
	if e.q.bytes == 0 {
		return nil
	}
	e.q.comps = append(e.q.comps, txComp{off: e.q.tail, c: comp})
	return uct.ErrInProgress
}

// PendingAdd queues r while the send queue is full; ErrBusy when it has room.
func (e *ep) PendingAdd(r *uct.PendingReq) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.err != nil {
		return e.err
	}
	if e.q.bytes < txLimit {
		return uct.ErrBusy
	}
	e.pending.Add(r)
	return nil
}

func (e *ep) PendingPurge(cb func(r *uct.PendingReq)) { e.pending.Purge(cb) }

func (e *ep) Address() ([]byte, error) { return nil, uct.NotSupported("tcp: ep address") }

func (e *ep) ConnectToEP(devAddr, epAddr []byte) error {
	return uct.NotSupported("tcp: connect to ep")
}

// progress handles poller events ev of the socket: writes queued data,
// fires completions of what is written and runs pending requests when there
// is room. A socket error or the peer shutting down fails the EP; the
// failure is reported once (worker only).
func (e *ep) progress(ev uint32) int {
	e.mu.Lock()
	if ev&(evErr|evRdHup) != 0 && e.err == nil {
		e.err = fmt.Errorf("tcp: connection to %s closed by the peer: %w", e.addr, uct.ErrEndpointReset)
	}
	if e.err != nil {
		if e.reported {
			e.mu.Unlock()
			return 0
		}
		e.reported = true
		err, closed := e.err, e.closed
		comps := e.takeComps()
		fd, raw := e.fd, e.raw
		e.mu.Unlock()
		if raw != nil {
			e.iface.detach(fd, e)
		}
		for _, c := range comps {
			c.Done(err)
		}
		if !closed {
			if h := e.iface.params.ErrHandler; h != nil {
				h(e, err)
			}
		}
		e.pending.Dispatch() // every request fails fast now
		return 1
	}
	empty := e.flush()
	if empty {
		e.setBacklog(false)
	}
	comps := e.q.done()
	room := e.q.bytes < txLimit && e.err == nil
	e.mu.Unlock()
	for _, c := range comps {
		c.Done(nil)
	}
	n := len(comps)
	if room && e.pending.Len() > 0 {
		n += e.pending.Dispatch()
	}
	return n
}

// takeComps removes every completion (e.mu held).
func (e *ep) takeComps() []*uct.Completion {
	out := make([]*uct.Completion, 0, len(e.q.comps))
	for _, c := range e.q.comps {
		out = append(out, c.c)
	}
	e.q.comps = nil
	return out
}

// Close closes the connection at once: queued data is dropped, completions
// still waiting fire with ErrCanceled on the worker, pending requests are
// dropped. Idempotent.
func (e *ep) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	if e.err == nil {
		e.err = fmt.Errorf("tcp: ep closed: %w", uct.ErrCanceled)
	}
	e.reported = true
	comps := e.takeComps()
	e.mu.Unlock()
	e.cancel()
	<-e.dialDone
	e.mu.Lock()
	conn, fd := e.conn, e.fd
	e.q.bufs, e.q.owner = nil, nil
	e.mu.Unlock()
	if conn != nil {
		e.iface.detach(fd, e)
		conn.Close()
	}
	if len(comps) > 0 {
		st := fmt.Errorf("tcp: ep closed: %w", uct.ErrCanceled)
		e.iface.w.Post(func() {
			for _, c := range comps {
				c.Done(st)
			}
		})
	}
	e.pending.Purge(nil)
	e.iface.forget(e)
	return nil
}
