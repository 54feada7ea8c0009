// Package shm is the shared-memory transport between processes of one host
// and one user (UCX uct/sm/mm posix for active messages, uct/sm/cma for
// zero-copy RMA). Import it for its side effect of registering the "shm"
// component; it is available on Linux only.
//
// Each iface owns one receive FIFO in an anonymous memfd (mode 0600, sealed
// against resizing, nothing on disk or in /dev/shm) that every sender maps
// and writes into. A sleeping receiver is woken through a datagram doorbell
// socket, rung only when the receiver announced sleep; a sender whose
// requests wait for room in a full FIFO is rung the same way by the
// receiver as soon as it frees room (its backoff timer is only a fallback:
// Go timers under a millisecond fire late in an idle process). GetZcopy and PutZcopy
// copy straight between the two processes with process_vm_readv/writev.
//
// The FIFO layout and the park protocol are documented in fifo.go.
//
// Trust: peers are processes of the same user, which could read our memory
// anyway; still, nothing a peer writes into a FIFO can make this package
// panic or access memory out of bounds (malformed elements are counted and
// dropped); a forged room waiter in the FIFO header costs at most a
// spurious wake-up of some gouct iface of the user. AM handlers get the payload in place in shared memory, valid
// during the call only; a misbehaving peer could change it meanwhile.
//
// Limits: a sender killed between reserving an element and publishing it
// (a window of a few instructions) wedges that FIFO: later elements wait
// behind it, as in UCX mm. Senders to an iface that closed or whose process
// died get uct.ErrEndpointReset once its FIFO is full. Under Yama
// ptrace_scope >= 1 (or a seccomp filter refusing process_vm_readv) the
// iface does not offer GetZcopy/PutZcopy rather than weaken ptrace
// protection with prctl(PR_SET_PTRACER).
package shm
