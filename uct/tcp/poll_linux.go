package tcp

import (
	"errors"
	"fmt"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Event flags of a pollEvent.
const (
	evIn    = unix.EPOLLIN | unix.EPOLLRDHUP
	evOut   = unix.EPOLLOUT
	evRdHup = unix.EPOLLRDHUP               // the peer shut down its side
	evErr   = unix.EPOLLERR | unix.EPOLLHUP // always reported
)

type pollEvent = unix.EpollEvent

func pollSupported() error { return nil }

// poller is an iface's epoll set (UCX tcp's async epoll): Progress asks it,
// without blocking, which sockets are ready (level-triggered: a socket stays
// ready until drained).
//
// A parked worker is woken by a waiter goroutine blocked in epoll_wait
// itself, not in the Go netpoller: the runtime polls the network only when a
// processor runs out of goroutines (or from sysmon every 10 ms), so while
// any goroutine spins with runtime.Gosched (a worker of another iface, a
// Read polling) a goroutine parked in the netpoller waits up to 10 ms. The
// cost is one OS thread per parked iface, blocked while the iface is idle.
// An eventfd in the set ends the wait on Close.
type poller struct {
	fd     int
	evfd   int // written once by wake: ends a block
	closed atomic.Bool
	one    [1]unix.EpollEvent // Arm's check (worker)
	wone   [1]unix.EpollEvent // block (waiter)
}

func newPoller() (*poller, error) {
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	evfd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	p := &poller{fd: fd, evfd: evfd}
	if err := p.add(evfd, unix.EPOLLIN); err != nil {
		unix.Close(evfd)
		unix.Close(fd)
		return nil, fmt.Errorf("epoll add eventfd: %w", err)
	}
	return p, nil
}

func (p *poller) add(fd int, events uint32) error {
	return unix.EpollCtl(p.fd, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: events, Fd: int32(fd)})
}

func (p *poller) mod(fd int, events uint32) error {
	return unix.EpollCtl(p.fd, unix.EPOLL_CTL_MOD, fd, &unix.EpollEvent{Events: events, Fd: int32(fd)})
}

func (p *poller) del(fd int) { unix.EpollCtl(p.fd, unix.EPOLL_CTL_DEL, fd, nil) }

// wait returns the ready sockets without blocking (worker only, while the
// iface is attached).
func (p *poller) wait(evs []pollEvent) int {
	n, err := unix.EpollWait(p.fd, evs, 0)
	if err != nil {
		return 0
	}
	return n
}

// ready reports whether a socket is ready, without blocking (worker only).
func (p *poller) ready() bool {
	n, err := unix.EpollWait(p.fd, p.one[:], 0)
	return err == nil && n > 0
}

// block waits until a socket is ready; after wake it returns an error
// (waiter only).
func (p *poller) block() error {
	for {
		if p.closed.Load() {
			return errPollerClosed
		}
		_, err := unix.EpollWait(p.fd, p.wone[:], -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("epoll_wait: %w", err)
		}
		if p.closed.Load() {
			return errPollerClosed
		}
		return nil
	}
}

// wake ends a block in progress and every later one.
func (p *poller) wake() {
	p.closed.Store(true)
	var one [8]byte
	one[0] = 1
	unix.Write(p.evfd, one[:])
}

// close releases the fds; call it after the waiter returned.
func (p *poller) close() error {
	unix.Close(p.evfd)
	return unix.Close(p.fd)
}

var errPollerClosed = errors.New("tcp: poller closed")

func eventFd(ev *pollEvent) int { return int(ev.Fd) }

func eventFlags(ev *pollEvent) uint32 { return ev.Events }
