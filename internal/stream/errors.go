package stream

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/gouct/gouct/uct"
)

// Errors. Conn methods return them wrapped in *net.OpError{Net: "rdma"};
// errors.Is matches both the sentinel and the errno it wraps.
var (
	// ErrPeerDied: the liveness channel closed without the peer's closing
	// notice (process death, network partition, bootstrap socket reset), or
	// the transport found the peer unreachable (uct.ErrUnreachable: its
	// iface or process is gone), whichever the survivor noticed first.
	ErrPeerDied = &connError{"peer died", syscall.ECONNRESET}
	// ErrPeerClosed: the peer closed the conn; writing to it is refused.
	ErrPeerClosed = &connError{"peer closed the connection", syscall.EPIPE}
	// ErrWriteClosed: Write after CloseWrite.
	ErrWriteClosed = &connError{"write after CloseWrite", syscall.EPIPE}
	// ErrProtocol: the peer broke the stream protocol; the conn was reset.
	ErrProtocol = &connError{"stream protocol violation", syscall.ECONNRESET}
	// ErrReset: the conn was reset (by the peer's RST or a local failure).
	ErrReset = &connError{"connection reset", syscall.ECONNRESET}
	// ErrNotStarted: Read or Write before Start.
	ErrNotStarted = errors.New("stream: conn not started")
)

// connError is a sentinel that also matches the errno it stands for.
type connError struct {
	msg   string
	errno syscall.Errno
}

func (e *connError) Error() string   { return "stream: " + e.msg }
func (e *connError) Unwrap() error   { return e.errno }
func (e *connError) Timeout() bool   { return false }
func (e *connError) Temporary() bool { return false }

// resetBy is the error of a conn reset with code by the peer (remote) or
// here. A local reset caused by an unreachable peer is its death.
func resetBy(remote bool, code uint32, cause error) error {
	if !remote && errors.Is(cause, uct.ErrUnreachable) {
		return fmt.Errorf("%w: transport: %w", ErrPeerDied, cause)
	}
	who := "locally"
	if remote {
		who = "by peer"
	}
	if cause != nil {
		return fmt.Errorf("%w %s (%s): %w", ErrReset, who, rstCodeString(code), cause)
	}
	return fmt.Errorf("%w %s (%s)", ErrReset, who, rstCodeString(code))
}
