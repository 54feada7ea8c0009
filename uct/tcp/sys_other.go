//go:build !unix

package tcp

import "syscall"

// writev: the transport is unavailable here (see pollSupported).
func writev(fd int, bufs [][]byte) (int, error) { return 0, syscall.EINVAL }

func (rc *rxConn) read(fd uintptr) bool {
	rc.n, rc.err = 0, syscall.EINVAL
	return true
}
