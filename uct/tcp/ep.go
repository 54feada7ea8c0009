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
	// txLimit bounds the bytes an EP queues (copies and zcopy references);
	// sends are admitted while less is queued, else ErrNoResource. The
	// writer may be writing one more such batch.
	txLimit = 64 << 10
	// arenaSize holds the copies of one batch: below txLimit, plus the
	// last admitted frame, plus the part of a frame a direct write consumed.
	arenaSize = txLimit + 2*(frameHdr+maxBcopy) + len(magic)

	dialTimeout = 10 * time.Second
)

// txq is a batch of bytes to write in order: copies in arena, and
// references to zcopy callers' buffers.
type txq struct {
	bufs  net.Buffers
	arena []byte // fixed capacity arenaSize, never reallocated
	tail  int    // start in arena of bufs' last element when tailOpen
	open  bool   // bufs' last element ends at len(arena) and may grow
	bytes int
	comps []*uct.Completion // fire once the batch is written
}

func (q *txq) empty() bool { return q.bytes == 0 && len(q.comps) == 0 }

// reserve appends n bytes of arena to the batch and returns them.
func (q *txq) reserve(n int) []byte {
	if q.arena == nil {
		q.arena = make([]byte, 0, arenaSize)
	}
	start := len(q.arena)
	q.arena = q.arena[:start+n]
	if q.open {
		q.bufs[len(q.bufs)-1] = q.arena[q.tail : start+n]
	} else {
		q.bufs = append(q.bufs, q.arena[start:start+n])
		q.tail, q.open = start, true
	}
	q.bytes += n
	return q.arena[start : start+n : start+n]
}

// trim gives back the last k reserved bytes.
func (q *txq) trim(k int) {
	q.arena = q.arena[:len(q.arena)-k]
	last := &q.bufs[len(q.bufs)-1]
	*last = (*last)[:len(*last)-k]
	q.bytes -= k
}

// ref appends a caller's buffer without copying it.
func (q *txq) ref(b []byte) {
	if len(b) == 0 {
		return
	}
	q.bufs = append(q.bufs, b)
	q.open = false
	q.bytes += len(b)
}

// consume drops the first n bytes, written by a direct write.
func (q *txq) consume(n int) {
	drop := 0
	for drop < len(q.bufs) && n >= len(q.bufs[drop]) {
		n -= len(q.bufs[drop])
		q.bytes -= len(q.bufs[drop])
		drop++
	}
	if drop < len(q.bufs) && n > 0 {
		q.bufs[drop] = q.bufs[drop][n:]
		q.bytes -= n
	}
	k := copy(q.bufs, q.bufs[drop:])
	clear(q.bufs[k:])
	q.bufs = q.bufs[:k]
	q.open = false
	if q.bytes == 0 {
		q.resetData()
	}
}

func (q *txq) resetData() {
	clear(q.bufs)
	q.bufs = q.bufs[:0]
	q.arena = q.arena[:0]
	q.open = false
	q.bytes = 0
}

// ep is an endpoint: one outgoing TCP connection to a peer iface. Methods
// are safe for concurrent use. A pack function given to AMBcopy runs with
// the EP locked and must not call the EP.
type ep struct {
	iface *iface
	addr  *net.TCPAddr

	mu      sync.Mutex
	q       txq // filled by senders
	out     txq // being written by the writer (while writing)
	writing bool
	conn    *net.TCPConn
	raw     syscall.RawConn
	err     error // why sends fail: closed, or the connection failed
	closed  bool

	kick   chan struct{} // 1 slot: wakes the writer
	cancel context.CancelFunc
	done   chan struct{} // closed when the writer exits

	pending    uct.PendingQueue
	dispatchFn func() // e.dispatch, bound once

	// Direct writes (under mu).
	wbufs   [][]byte
	wn      int
	writeFn func(fd uintptr) bool
}

func newEP(i *iface, a *net.TCPAddr) *ep {
	ctx, cancel := context.WithCancel(context.Background())
	e := &ep{iface: i, addr: a, kick: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
	e.dispatchFn = e.dispatch
	e.writeFn = e.doWrite
	copy(e.q.reserve(len(magic)), magic)
	go e.run(ctx)
	return e
}

// admit reports why a send cannot be queued now (e.mu held).
func (e *ep) admit() error {
	if e.err != nil {
		return e.err
	}
	if e.q.bytes >= txLimit {
		return uct.ErrNoResource
	}
	if e.q.bytes == 0 {
		e.q.resetData()
	}
	return nil
}

// direct reports whether a sender may write to the socket itself: nothing
// queued or being written, connected (e.mu held).
func (e *ep) direct() bool {
	return e.q.empty() && !e.writing && e.raw != nil
}

// sent writes the batch now when direct, else leaves it to the writer.
// It reports whether the batch was entirely written (e.mu held).
func (e *ep) sent(direct bool) bool {
	if direct {
		e.wbufs, e.wn = e.q.bufs, 0
		e.raw.Write(e.writeFn) // never waits: doWrite returns true
		e.wbufs = nil
		e.q.consume(e.wn)
		if e.q.bytes == 0 {
			return true
		}
	}
	select {
	case e.kick <- struct{}{}:
	default:
	}
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
	d := e.direct()
	b := e.q.reserve(frameHdr + 8 + len(payload))
	b[0] = id
	binary.LittleEndian.PutUint32(b[1:], uint32(8+len(payload)))
	binary.LittleEndian.PutUint64(b[frameHdr:], hdr)
	copy(b[frameHdr+8:], payload)
	e.sent(d)
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
	d := e.direct()
	b := e.q.reserve(frameHdr + maxBcopy)
	n := pack(b[frameHdr:])
	if n < 0 || n > maxBcopy {
		e.q.trim(frameHdr + maxBcopy)
		return 0, fmt.Errorf("tcp: pack wrote %d bytes of %d: %w", n, maxBcopy, uct.ErrMessageSize)
	}
	e.q.trim(maxBcopy - n)
	b[0] = id
	binary.LittleEndian.PutUint32(b[1:], uint32(n))
	e.sent(d)
	return n, nil
}

// AMZcopy writes header and iov with one writev when the socket has room;
// otherwise the rest stays referenced (not copied) until the writer has
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
	d := e.direct()
	b := e.q.reserve(frameHdr + len(header))
	b[0] = id
	binary.LittleEndian.PutUint32(b[1:], uint32(len(header)+n))
	copy(b[frameHdr:], header)
	for _, v := range iov {
		e.q.ref(v.Buf)
	}
	if e.sent(d) || n == 0 {
		return nil
	}
	e.q.comps = append(e.q.comps, comp)
	return uct.ErrInProgress
}

func (e *ep) PutZcopy(iov []uct.IOV, raddr uint64, rkey []byte, comp *uct.Completion) error {
	return uct.NotSupported("tcp: put_zcopy")
}

func (e *ep) GetZcopy(iov []uct.IOV, raddr uint64, rkey []byte, comp *uct.Completion) error {
	return uct.NotSupported("tcp: get_zcopy")
}

// Flush: nil when nothing is queued or being written; else comp fires once
// everything sent before it is written to the socket.
func (e *ep) Flush(comp *uct.Completion) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.err != nil {
		return e.err
	}
	if e.q.empty() && !e.writing {
		return nil
	}
	e.q.comps = append(e.q.comps, comp)
	select {
	case e.kick <- struct{}{}:
	default:
	}
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

// dispatch runs queued requests on the worker after the writer made room.
func (e *ep) dispatch() { e.pending.Dispatch() }

func (e *ep) PendingPurge(cb func(r *uct.PendingReq)) { e.pending.Purge(cb) }

func (e *ep) Address() ([]byte, error) { return nil, uct.NotSupported("tcp: ep address") }

func (e *ep) ConnectToEP(devAddr, epAddr []byte) error {
	return uct.NotSupported("tcp: connect to ep")
}

// Close closes the connection at once: queued data is dropped, and pending
// completions fire with ErrCanceled on the worker. Idempotent; it waits for
// the writer goroutine.
func (e *ep) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		<-e.done
		return nil
	}
	e.closed = true
	if e.err == nil {
		e.err = fmt.Errorf("tcp: ep: %w", uct.ErrClosed)
	}
	conn := e.conn
	e.mu.Unlock()
	e.cancel()
	if conn != nil {
		conn.Close() // unblocks a writer stuck in Write
	}
	select {
	case e.kick <- struct{}{}:
	default:
	}
	<-e.done
	e.pending.Purge(nil)
	e.iface.forget(e)
	return nil
}

// fire runs completions on the worker with status st.
func (e *ep) fire(comps []*uct.Completion, st error) {
	if len(comps) == 0 {
		return
	}
	c := append([]*uct.Completion(nil), comps...)
	e.iface.w.Post(func() {
		for _, x := range c {
			x.Done(st)
		}
	})
}

// run is the writer goroutine: it connects, then writes every batch the
// senders queue, parked in the netpoller while the socket is full.
func (e *ep) run(ctx context.Context) {
	defer close(e.done)
	d := net.Dialer{Timeout: dialTimeout}
	c, err := d.DialContext(ctx, "tcp4", e.addr.String())
	var conn *net.TCPConn
	if err == nil {
		conn = c.(*net.TCPConn)
		e.mu.Lock()
		if e.closed {
			err = e.err
		} else {
			e.conn = conn
			e.raw, err = conn.SyscallConn()
		}
		e.mu.Unlock()
	}
	if err == nil {
		err = e.writeLoop(conn)
	}
	if conn != nil {
		conn.Close()
	}
	// Fail everything still queued; report an unexpected failure.
	e.mu.Lock()
	closed := e.closed
	if e.err == nil {
		e.err = fmt.Errorf("tcp: connection to %s: %v: %w", e.addr, err, uct.ErrEndpointReset)
	}
	st := e.err
	if closed {
		st = fmt.Errorf("tcp: ep closed: %w", uct.ErrCanceled)
	}
	comps := append(e.q.comps, e.out.comps...)
	e.q.comps, e.out.comps = nil, nil
	e.q.resetData()
	e.mu.Unlock()
	e.fire(comps, st)
	if !closed {
		if h := e.iface.params.ErrHandler; h != nil {
			e.iface.w.Post(func() { h(e, st) })
		}
		// Requests waiting for room will never get it: let them fail fast.
		e.iface.w.Post(e.dispatchFn)
	}
}

func (e *ep) writeLoop(conn *net.TCPConn) error {
	for {
		e.mu.Lock()
		for e.q.empty() && e.err == nil {
			e.mu.Unlock()
			<-e.kick
			e.mu.Lock()
		}
		if e.err != nil {
			e.mu.Unlock()
			return e.err
		}
		e.q, e.out = e.out, e.q
		e.writing = true
		room := e.pending.Len() > 0
		e.mu.Unlock()
		if room {
			e.iface.w.Post(e.dispatchFn)
		}
		bufs := e.out.bufs
		_, err := bufs.WriteTo(conn)
		e.mu.Lock()
		e.writing = false
		if err != nil {
			e.mu.Unlock()
			return err
		}
		comps := e.out.comps
		e.out.comps = e.out.comps[:0]
		e.out.resetData()
		e.mu.Unlock()
		e.fire(comps, nil)
	}
}
