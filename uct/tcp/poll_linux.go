package tcp

import (
	"fmt"
	"os"
	"syscall"

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
// without blocking, which sockets are ready; a parked worker is woken
// through the epoll fd itself, which sits in the Go netpoller (nested epoll),
// so no OS thread blocks. Level-triggered: a socket stays ready until drained.
type poller struct {
	fd  int
	f   *os.File
	raw syscall.RawConn
	one [1]unix.EpollEvent
}

func newPoller() (*poller, error) {
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("epoll nonblock: %w", err)
	}
	f := os.NewFile(uintptr(fd), "tcp-epoll")
	raw, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("epoll raw conn: %w", err)
	}
	return &poller{fd: fd, f: f, raw: raw}, nil
}

func (p *poller) add(fd int, events uint32) error {
	return unix.EpollCtl(p.fd, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: events, Fd: int32(fd)})
}

func (p *poller) mod(fd int, events uint32) error {
	return unix.EpollCtl(p.fd, unix.EPOLL_CTL_MOD, fd, &unix.EpollEvent{Events: events, Fd: int32(fd)})
}

func (p *poller) del(fd int) { unix.EpollCtl(p.fd, unix.EPOLL_CTL_DEL, fd, nil) }

// wait returns the ready sockets without blocking (worker only, while the
// iface is attached: the fd stays open until then).
func (p *poller) wait(evs []pollEvent) int {
	n, err := unix.EpollWait(p.fd, evs, 0)
	if err != nil {
		return 0
	}
	return n
}

func (p *poller) ready() bool {
	n, err := unix.EpollWait(p.fd, p.one[:], 0)
	return err == nil && n > 0
}

// block parks the calling goroutine in the netpoller until a socket is
// ready or the poller is closed (then it returns an error).
func (p *poller) block() error {
	return p.raw.Read(func(uintptr) bool { return p.ready() })
}

func (p *poller) close() error { return p.f.Close() }

func eventFd(ev *pollEvent) int { return int(ev.Fd) }

func eventFlags(ev *pollEvent) uint32 { return ev.Events }
