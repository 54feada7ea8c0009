//go:build unix

package tcp

import "golang.org/x/sys/unix"

// doWrite is the direct write: one non-blocking writev of e.wbufs; e.wn is
// how much the socket took (0 when it is full: EAGAIN). A failure is left
// for the writer goroutine, whose blocking write reports it.
func (e *ep) doWrite(fd uintptr) bool {
	if n, err := unix.Writev(int(fd), e.wbufs); err == nil && n > 0 {
		e.wn = n
	}
	return true
}
