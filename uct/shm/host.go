//go:build linux

package shm

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Device address: who may share memory with whom. Two ifaces reach each other
// only when every field matches: same boot of the same kernel, same user, and
// the same pid and network namespaces (pids in iface addresses and the
// doorbell's abstract socket names are namespace-relative).
//
//	| off | size | field                                   |
//	|   0 |   16 | boot id (/proc/sys/kernel/random/boot_id) |
//	|  16 |    4 | uid, little-endian                      |
//	|  20 |    8 | pid namespace inode                     |
//	|  28 |    8 | network namespace inode                 |
const devAddrLen = 36

var host struct {
	once sync.Once
	addr []byte
	err  error
}

// hostIdentity returns this process's device address (computed once).
func hostIdentity() ([]byte, error) {
	host.once.Do(func() { host.addr, host.err = readHostIdentity() })
	return host.addr, host.err
}

func readHostIdentity() ([]byte, error) {
	raw, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return nil, fmt.Errorf("host identity: %w", err)
	}
	id, err := hex.DecodeString(strings.ReplaceAll(strings.TrimSpace(string(raw)), "-", ""))
	if err != nil || len(id) != 16 {
		return nil, fmt.Errorf("host identity: malformed boot id %q", raw)
	}
	b := make([]byte, 0, devAddrLen)
	b = append(b, id...)
	b = binary.LittleEndian.AppendUint32(b, uint32(os.Getuid()))
	for _, ns := range []string{"/proc/self/ns/pid", "/proc/self/ns/net"} {
		var st unix.Stat_t
		if err := unix.Stat(ns, &st); err != nil {
			return nil, fmt.Errorf("host identity: %s: %w", ns, err)
		}
		b = binary.LittleEndian.AppendUint64(b, st.Ino)
	}
	return b, nil
}

var probeSrc, probeDst [8]byte

var rmaProbe struct {
	once sync.Once
	err  error
}

// rmaSupported reports whether process_vm_readv/writev can be used between
// processes of this user (UCX cma): nil, or why not. Under Yama ptrace_scope
// >= 1 a process may only read another that named it with
// prctl(PR_SET_PTRACER); granting that to any process of the user would undo
// what the administrator asked for, so the iface drops GetZcopy/PutZcopy
// instead (active messages still work). Seccomp filters that refuse the call
// are caught by trying it on ourselves.
func rmaSupported() error {
	rmaProbe.once.Do(func() {
		if b, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope"); err == nil {
			if s := strings.TrimSpace(string(b)); s != "0" {
				rmaProbe.err = fmt.Errorf("yama ptrace_scope=%s forbids cross-process memory access", s)
				return
			}
		}
		// Package-level buffers: a stack address passed as uintptr could move.
		probeSrc[0] = 42
		local := []unix.Iovec{{Base: &probeDst[0], Len: uint64(len(probeDst))}}
		remote := []unix.RemoteIovec{{Base: uintptr(unsafe.Pointer(&probeSrc[0])), Len: len(probeSrc)}}
		n, err := unix.ProcessVMReadv(os.Getpid(), local, remote, 0)
		if err != nil || n != len(probeDst) || probeDst[0] != 42 {
			rmaProbe.err = fmt.Errorf("process_vm_readv: n=%d: %v", n, err)
		}
	})
	return rmaProbe.err
}
