// Package shm is the shared-memory transport between processes of one host
// and one user (UCX uct/sm/mm posix for active messages, uct/sm/cma for
// zero-copy RMA). Import it for its side effect of registering the "shm"
// component; it is available on Linux only.
//
// Each iface owns one receive FIFO in an anonymous memfd (mode 0600, sealed
// against resizing, nothing on disk or in /dev/shm) that every sender maps
// and writes into. A sleeping receiver is woken through a datagram doorbell
// socket, rung only when the receiver announced sleep. GetZcopy and PutZcopy
// copy straight between the two processes with process_vm_readv/writev.
//
// The FIFO layout and the park protocol are documented in fifo.go.
package shm
