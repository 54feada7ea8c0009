// Package listener is the server side of rdmanet: a net.Listener whose
// accept loop takes bootstrap TCP connections, runs each wireup handshake in
// its own goroutine (bounded by Config.MaxHandshakes, each under
// Config.HandshakeTimeout and the wire size limits), and hands out only
// completed conns. A slow, malformed or hostile client costs one handshake
// slot until its deadline and never delays the others.
//
// Most programs use rdmanet.Listen; this package is for embedding.
package listener

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gouct/gouct/internal/rt"
	"github.com/gouct/gouct/internal/stream"
	"github.com/gouct/gouct/uct"
)

// Listener accepts rdmanet conns. Accept, Addr and Close may be called from
// any goroutine.
type Listener struct {
	tl   *net.TCPListener
	cfg  *uct.Config
	rt   *rt.Runtime
	addr stream.Addr
	log  *slog.Logger

	sem   chan struct{} // one token per handshake in flight or conn waiting for Accept
	conns chan rt.Conn  // completed conns, handed to Accept
	done  chan struct{} // closed by Close
	errc  chan struct{} // closed when the accept loop stops on an error
	err   error         // that error (read after errc is closed)

	mu       sync.Mutex
	closed   bool
	inflight map[*net.TCPConn]struct{} // sockets of handshakes not yet handed to a stream
	wg       sync.WaitGroup
	once     sync.Once

	// Failed counts handshakes that failed (bad hello, timeout, refused);
	// for tests and monitoring.
	Failed atomic.Uint64
}

// Listen announces on the local network address (host:port of the bootstrap
// TCP socket) for network "rdma", "rdma4" or "rdma6". cfg nil means the
// environment (RDMANET_*); zero fields of a non-nil cfg take the
// environment's values. The process-wide runtime (worker, ifaces) opens on
// first use.
func Listen(ctx context.Context, network, address string, cfg *uct.Config) (*Listener, error) {
	tcpNet, err := rt.TCPNetwork(network)
	if err != nil {
		return nil, &net.OpError{Op: "listen", Net: network, Err: err}
	}
	c, err := rt.Resolve(cfg)
	if err != nil {
		return nil, &net.OpError{Op: "listen", Net: network, Err: err}
	}
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, tcpNet, address)
	if err != nil {
		return nil, err
	}
	ln := &Listener{
		tl:       l.(*net.TCPListener),
		cfg:      c,
		rt:       rt.Get(c),
		addr:     rt.Addr(l.Addr()),
		log:      rt.Logger(c).With("listener", l.Addr().String()),
		sem:      make(chan struct{}, c.MaxHandshakes),
		conns:    make(chan rt.Conn),
		done:     make(chan struct{}),
		errc:     make(chan struct{}),
		inflight: map[*net.TCPConn]struct{}{},
	}
	ln.wg.Add(1)
	go ln.acceptLoop()
	return ln, nil
}

// Addr is the listener's address: Network() "rdma", String() the bootstrap
// socket's host:port.
func (l *Listener) Addr() net.Addr { return l.addr }

// Accept waits for the next conn whose handshake completed. The conn
// implements rdmanet.Conn. After Close it returns an error wrapping
// net.ErrClosed.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, l.opErr(net.ErrClosed)
	case <-l.errc:
		select {
		case c := <-l.conns:
			return c, nil
		default:
		}
		return nil, l.opErr(l.err)
	}
}

func (l *Listener) opErr(err error) error {
	return &net.OpError{Op: "accept", Net: "rdma", Addr: l.addr, Err: err}
}

// Close stops accepting, aborts the handshakes in flight and closes the
// completed conns nobody accepted. Conns already returned by Accept are not
// affected. Close waits for the listener's goroutines and is idempotent.
func (l *Listener) Close() error {
	var err error
	l.once.Do(func() {
		l.mu.Lock()
		l.closed = true
		for c := range l.inflight {
			c.Close()
		}
		l.mu.Unlock()
		close(l.done)
		err = l.tl.Close()
		l.wg.Wait()
	})
	return err
}

func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	var backoff time.Duration
	for {
		// Take a slot first: beyond MaxHandshakes, clients wait in the
		// kernel's accept queue.
		select {
		case l.sem <- struct{}{}:
		case <-l.done:
			return
		}
		c, err := l.tl.AcceptTCP()
		if err != nil {
			<-l.sem
			select {
			case <-l.done:
				return
			default:
			}
			if temporary(err) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				l.log.Warn("rdmanet: accept", "err", err, "retry_in", backoff)
				select {
				case <-time.After(backoff):
				case <-l.done:
					return
				}
				continue
			}
			l.err = err
			close(l.errc)
			return
		}
		backoff = 0
		if !l.track(c) {
			c.Close()
			<-l.sem
			return
		}
		l.wg.Add(1)
		go l.serve(c)
	}
}

// track records c as a handshake in flight; false after Close.
func (l *Listener) track(c *net.TCPConn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.inflight[c] = struct{}{}
	return true
}

// detach hands c over to a stream or fallback conn: from then on Close no
// longer closes it. False when the listener is closing (c is then closed by
// Close or the caller).
func (l *Listener) detach(c *net.TCPConn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	delete(l.inflight, c)
	return true
}

func (l *Listener) untrack(c *net.TCPConn) {
	l.mu.Lock()
	delete(l.inflight, c)
	l.mu.Unlock()
}

// serve runs one handshake and queues its conn for Accept.
func (l *Listener) serve(c *net.TCPConn) {
	defer l.wg.Done()
	defer func() { <-l.sem }()
	conn, err := l.handshake(c)
	if err != nil {
		l.untrack(c)
		c.Close()
		l.mu.Lock()
		aborted := l.closed // Close aborted it: not a failure
		l.mu.Unlock()
		if !aborted {
			l.Failed.Add(1)
			rt.HandshakeFailed("accept")
			l.log.Warn("rdmanet: handshake failed", "remote", c.RemoteAddr().String(), "err", err)
		}
		return
	}
	select {
	case l.conns <- conn:
	case <-l.done:
		conn.Close()
	}
}

// temporary reports accept errors worth retrying after a pause (out of
// descriptors or memory), as net/http's server does.
func temporary(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	for _, e := range []error{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
