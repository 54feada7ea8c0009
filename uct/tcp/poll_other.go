//go:build !linux

package tcp

import (
	"fmt"
	"runtime"

	"github.com/gouct/gouct/uct"
)

const (
	evIn    = 1
	evOut   = 4
	evRdHup = 0x2000
	evErr   = 8
)

type pollEvent struct {
	Events uint32
	Fd     int32
}

func pollSupported() error {
	return fmt.Errorf("tcp: needs epoll, not on %s: %w", runtime.GOOS, uct.ErrUnavailable)
}

type poller struct{}

func newPoller() (*poller, error)                 { return nil, pollSupported() }
func (p *poller) add(fd int, events uint32) error { return pollSupported() }
func (p *poller) mod(fd int, events uint32) error { return pollSupported() }
func (p *poller) del(fd int)                      {}
func (p *poller) wait(evs []pollEvent) int        { return 0 }
func (p *poller) ready() bool                     { return false }
func (p *poller) block() error                    { return pollSupported() }
func (p *poller) wake()                           {}
func (p *poller) close() error                    { return nil }
func eventFd(ev *pollEvent) int                   { return int(ev.Fd) }
func eventFlags(ev *pollEvent) uint32             { return ev.Events }
