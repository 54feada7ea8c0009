//go:build unix

package tcp

import (
	"io"
	"syscall"

	"golang.org/x/sys/unix"
)

// writev is one non-blocking writev; n is 0 when the socket is full (EAGAIN).
func writev(fd int, bufs [][]byte) (int, error) {
	n, err := unix.Writev(fd, bufs)
	return max(n, 0), err
}

// read is one non-blocking read into rc.buf (raw.Read callback, never waits).
func (rc *rxConn) read(fd uintptr) bool {
	rc.n, rc.err = syscall.Read(int(fd), rc.buf[rc.w:])
	if rc.err == syscall.EAGAIN || rc.err == syscall.EINTR {
		rc.n, rc.err = 0, nil
	} else if rc.err == nil && rc.n == 0 {
		rc.err = io.EOF
	}
	if rc.n < 0 {
		rc.n = 0
	}
	return true
}
