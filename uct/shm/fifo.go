//go:build linux

package shm

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The receive FIFO: a multi-producer, single-consumer ring in a memfd that
// the owning iface consumes and every sender maps (UCX uct_mm_fifo). A
// ticket t names element t mod N; each element carries a sequence word that
// says whose turn it is (bounded MPMC queue after D. Vyukov):
//
//	seq == t      free for the producer holding ticket t
//	seq == t+1    published: the consumer may read ticket t
//	seq == t+N    released by the consumer: free for ticket t+N
//
// A producer reserves ticket h by CAS on head while seq(h) == h (seq < h
// means the ring is full: ErrNoResource), fills the element and publishes
// with a store of h+1. The consumer reads tail while seq(tail) == tail+1,
// runs the handler, releases with a store of tail+N and advances tail.
//
// Header (little-endian; counters on their own cache lines, accessed atomically):
//
//	| off | size | field                                          |
//	|   0 |    8 | magic "gouctshm"                               |
//	|   8 |    4 | version (1)                                    |
//	|  12 |    4 | element count N (power of two)                 |
//	|  16 |    4 | element stride in bytes (multiple of 64)       |
//	|  20 |    4 | segment size: largest payload of one element   |
//	|  24 |    8 | nonce: random, also in the iface address       |
//	|  64 |    8 | head: next ticket to reserve (producers)       |
//	| 128 |    8 | tail: next ticket to consume (consumer)        |
//	| 192 |    4 | sleep: 1 while the consumer may be parked      |
//	| 196 |    4 | closed: 1 once the owning iface closed         |
//	| 200 |    8 | waiter: nonce of a producer iface that found   |
//	|     |      | the ring full and waits for room, or 0         |
//	| 208 |    4 | waiter's pid                                   |
//	| 256 |  N*stride | elements                                  |
//
// Element:
//
//	| off | size | field                                       |
//	|   0 |    8 | seq - (t mod N), see seq                    |
//	|   8 |    1 | AM id                                       |
//	|   9 |    1 | flags (1: padding, skip)                    |
//	|  12 |    4 | payload length once published; while        |
//	|     |      | reserved: ownerBit | the producer's pid       |
//	|  16 |  seg | payload                                     |
//
// Dead producers: a producer stamps its pid into the element right after
// its CAS on head. A consumer that finds its next element reserved but
// unpublished for stuckAfter checks that pid; if the process is gone (it
// cannot publish any more) the consumer pads the element and moves on, so
// a peer killed mid-send does not wedge the FIFO for every other sender.
//
// Room protocol: a producer whose requests wait for room (a full ring)
// stores its pid, then its nonce in waiter, then re-checks for room before
// it parks; the consumer, after releasing elements, swaps waiter to 0 and
// rings that producer's doorbell. Either the producer sees the room or the
// consumer sees the waiter. One slot: a second waiting producer overwrites
// the first, which then falls back to its backoff timer (iface.go).
//
// Park protocol (DESIGN.md "Calibration", lost-wakeup safe): the consumer
// stores sleep=1, then re-checks the ring; if anything is there it takes the
// flag back with CAS 1->0 (if that fails a producer owns the wake-up and its
// doorbell is absorbed by the doorbell goroutine as one spurious wake) and
// does not park. A producer publishes, then loads sleep and rings the
// doorbell only if its own CAS 1->0 succeeds: exactly one side owns each
// wake-up, and a running consumer costs producers one atomic load.
const (
	fifoMagic   = "gouctshm"
	fifoVersion = 1

	offHead  = 64
	offTail  = 128
	offSleep = 192
	offClose = 196
	offWaitN = 200
	offWaitP = 208
	hdrSize  = 256

	elemHdr    = 16
	flagPad    = 1
	ownerBit   = 1 << 31 // in the length word while a producer owns the element
	maxMapSize = 1 << 30
)

// fifo is one mapping of a receive FIFO: the owner's or a sender's. The
// geometry fields are private copies taken when mapping, never re-read from
// shared memory, so a misbehaving peer cannot steer an access out of bounds.
type fifo struct {
	mem    []byte
	base   unsafe.Pointer
	n      uint64
	mask   uint64
	stride uint64
	seg    int
	nonce  uint64
}

func fifoGeometry(nelems, seg int) (stride uint64, size int, err error) {
	if nelems < 2 || nelems&(nelems-1) != 0 || nelems > 1<<20 {
		return 0, 0, fmt.Errorf("fifo size %d: not a power of two in [2, 1M]", nelems)
	}
	if seg < 64 || seg > 1<<20 {
		return 0, 0, fmt.Errorf("segment size %d: not in [64, 1M]", seg)
	}
	stride = uint64(elemHdr+seg+63) &^ 63
	total := uint64(hdrSize) + stride*uint64(nelems)
	if total > maxMapSize {
		return 0, 0, fmt.Errorf("fifo of %d x %d bytes exceeds %d", nelems, seg, maxMapSize)
	}
	return stride, int(total), nil
}

// createFIFO makes a new FIFO in an anonymous memfd (mode 0600, sealed
// against shrinking and growing so no peer can make our accesses fault) and
// maps it. The caller owns fd and must close it and unmap f.
func createFIFO(nelems, seg int, nonce uint64) (f *fifo, fd int, err error) {
	stride, size, err := fifoGeometry(nelems, seg)
	if err != nil {
		return nil, -1, err
	}
	fd, err = unix.MemfdCreate("gouct-shm", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, -1, fmt.Errorf("memfd_create: %w", err)
	}
	fail := func(what string, err error) (*fifo, int, error) {
		unix.Close(fd)
		return nil, -1, fmt.Errorf("%s: %w", what, err)
	}
	if err := unix.Fchmod(fd, 0o600); err != nil {
		return fail("fchmod memfd", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return fail("ftruncate memfd", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return fail("seal memfd", err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail("mmap fifo", err)
	}
	copy(mem, fifoMagic)
	binary.LittleEndian.PutUint32(mem[8:], fifoVersion)
	binary.LittleEndian.PutUint32(mem[12:], uint32(nelems))
	binary.LittleEndian.PutUint32(mem[16:], uint32(stride))
	binary.LittleEndian.PutUint32(mem[20:], uint32(seg))
	binary.LittleEndian.PutUint64(mem[24:], nonce)
	f = &fifo{mem: mem, base: unsafe.Pointer(&mem[0]), n: uint64(nelems), mask: uint64(nelems - 1),
		stride: stride, seg: seg, nonce: nonce}
	return f, fd, nil
}

// openFIFO maps the FIFO of iface (pid, fd, nonce) through the proc link
// /proc/<pid>/fd/<fd> (UCX's proc-link method). It refuses a file that is
// not ours, not mode 0600, not sealed against shrinking, or whose header
// does not match the nonce of the address.
func openFIFO(pid, fd int, nonce uint64) (*fifo, error) {
	path := fmt.Sprintf("/proc/%d/fd/%d", pid, fd)
	// A stale address may name a reused fd: never open anything but a
	// regular file of ours (a device could react to being opened). The
	// same checks are repeated on the opened file below.
	var pre unix.Stat_t
	if err := unix.Stat(path, &pre); err != nil {
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	if pre.Mode&unix.S_IFMT != unix.S_IFREG || pre.Uid != uint32(os.Getuid()) {
		return nil, fmt.Errorf("%s: not a regular file of uid %d", path, os.Getuid())
	}
	mfd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOCTTY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(mfd) // the mapping keeps the memory
	var st unix.Stat_t
	if err := unix.Fstat(mfd, &st); err != nil {
		return nil, fmt.Errorf("fstat %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Uid != uint32(os.Getuid()) || st.Mode&0o777 != 0o600 {
		return nil, fmt.Errorf("%s: owner %d mode %o: not a private fifo of uid %d", path, st.Uid, st.Mode, os.Getuid())
	}
	seals, err := unix.FcntlInt(uintptr(mfd), unix.F_GET_SEALS, 0)
	if err != nil || seals&unix.F_SEAL_SHRINK == 0 {
		return nil, fmt.Errorf("%s: not sealed against shrinking (seals %#x, %v)", path, seals, err)
	}
	if st.Size < hdrSize || st.Size > maxMapSize {
		return nil, fmt.Errorf("%s: size %d", path, st.Size)
	}
	mem, err := unix.Mmap(mfd, 0, int(st.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap %s: %w", path, err)
	}
	bad := func(why string) (*fifo, error) {
		unix.Munmap(mem)
		return nil, fmt.Errorf("%s: %s", path, why)
	}
	if string(mem[:8]) != fifoMagic || binary.LittleEndian.Uint32(mem[8:]) != fifoVersion {
		return bad("not a gouct fifo")
	}
	if binary.LittleEndian.Uint64(mem[24:]) != nonce {
		return bad("nonce mismatch (the iface is gone)")
	}
	n := int(binary.LittleEndian.Uint32(mem[12:]))
	seg := int(binary.LittleEndian.Uint32(mem[20:]))
	stride, size, err := fifoGeometry(n, seg)
	if err != nil || stride != uint64(binary.LittleEndian.Uint32(mem[16:])) || size > len(mem) {
		return bad(fmt.Sprintf("bad geometry %d x %d (%v)", n, seg, err))
	}
	return &fifo{mem: mem, base: unsafe.Pointer(&mem[0]), n: uint64(n), mask: uint64(n - 1),
		stride: stride, seg: seg, nonce: nonce}, nil
}

func (f *fifo) unmap() error {
	if f.mem == nil {
		return nil
	}
	err := unix.Munmap(f.mem)
	f.mem, f.base = nil, nil
	return err
}

func (f *fifo) word(off uintptr) *uint64 { return (*uint64)(unsafe.Add(f.base, off)) }
func (f *fifo) head() *uint64            { return f.word(offHead) }
func (f *fifo) tail() *uint64            { return f.word(offTail) }
func (f *fifo) sleep() *uint32           { return (*uint32)(unsafe.Add(f.base, offSleep)) }
func (f *fifo) closed() *uint32          { return (*uint32)(unsafe.Add(f.base, offClose)) }
func (f *fifo) waiter() *uint64          { return f.word(offWaitN) }
func (f *fifo) waiterPid() *uint32       { return (*uint32)(unsafe.Add(f.base, offWaitP)) }

// wantRoom registers the producer iface (pid, nonce) as waiting for room
// (room protocol). The caller re-checks hasRoom afterwards.
func (f *fifo) wantRoom(pid int, nonce uint64) {
	if atomic.LoadUint64(f.waiter()) == nonce {
		return // already registered: no cache-line write per check
	}
	atomic.StoreUint32(f.waiterPid(), uint32(pid))
	atomic.StoreUint64(f.waiter(), nonce)
}

// takeWaiter returns and clears the producer waiting for room (consumer
// side, after releasing elements); nonce 0 when none.
func (f *fifo) takeWaiter() (pid int, nonce uint64) {
	w := f.waiter()
	if atomic.LoadUint64(w) == 0 {
		return 0, 0
	}
	nonce = atomic.SwapUint64(w, 0)
	return int(atomic.LoadUint32(f.waiterPid())), nonce
}

func (f *fifo) elem(t uint64) unsafe.Pointer {
	return unsafe.Add(f.base, hdrSize+(t&f.mask)*f.stride)
}
func (f *fifo) seqp(t uint64) *uint64 { return (*uint64)(f.elem(t)) }

// The sequence word is stored relative to the element index k = t mod N
// (seq - k), so that a fresh, all-zero memfd is already initialised and its
// pages stay untouched (not resident) until the ring first reaches them.
func (f *fifo) seq(t uint64) uint64       { return atomic.LoadUint64(f.seqp(t)) + t&f.mask }
func (f *fifo) setSeq(t uint64, v uint64) { atomic.StoreUint64(f.seqp(t), v-t&f.mask) }

// data is the payload area of ticket t's element (seg bytes).
func (f *fifo) data(t uint64) []byte {
	return unsafe.Slice((*byte)(unsafe.Add(f.elem(t), elemHdr)), f.seg)
}

// reserveTries bounds the CAS loop so that a peer scribbling on head cannot
// keep a sender spinning: after that many lost races the send reports
// ErrNoResource and is retried later.
const reserveTries = 1024

// reserve claims the next free element for a producer; ok is false when the
// ring is full.
func (f *fifo) reserve() (t uint64, ok bool) {
	head := f.head()
	for range reserveTries {
		h := atomic.LoadUint64(head)
		d := int64(f.seq(h) - h)
		if d == 0 {
			if atomic.CompareAndSwapUint64(head, h, h+1) {
				atomic.StoreUint32(f.lenp(h), ownerBit|uint32(selfPid))
				return h, true
			}
		} else if d < 0 {
			return 0, false
		}
	}
	return 0, false
}

// publish hands ticket t (n payload bytes for AM id) to the consumer.
func (f *fifo) publish(t uint64, id uint8, flags uint8, n int) {
	e := f.elem(t)
	*(*uint8)(unsafe.Add(e, 8)) = id
	*(*uint8)(unsafe.Add(e, 9)) = flags
	atomic.StoreUint32(f.lenp(t), uint32(n))
	f.setSeq(t, t+1)
}

// lenp is ticket t's length word (the owner's pid while reserved).
func (f *fifo) lenp(t uint64) *uint32 { return (*uint32)(unsafe.Add(f.elem(t), 12)) }

// selfPid is stamped into reserved elements.
var selfPid = os.Getpid()

// deadOwner reports whether unpublished ticket t was reserved by a
// process that no longer exists (consumer side). An element not stamped
// yet, or stamped by a live process, is not dead.
func (f *fifo) deadOwner(t uint64) bool {
	if int64(atomic.LoadUint64(f.head())-t) <= 0 || f.ready(t) {
		return false // not reserved, or published meanwhile
	}
	w := atomic.LoadUint32(f.lenp(t))
	if w&ownerBit == 0 {
		return false
	}
	pid := int(w &^ ownerBit)
	return pid > 0 && unix.Kill(pid, 0) == unix.ESRCH && !f.ready(t)
}

// hasRoom reports whether a reserve would find a free element now.
func (f *fifo) hasRoom() bool {
	h := atomic.LoadUint64(f.head())
	return int64(f.seq(h)-h) >= 0
}

// ready reports whether ticket t is published (consumer side).
func (f *fifo) ready(t uint64) bool { return f.seq(t) == t+1 }

// msg returns the AM id, flags and payload length of published ticket t.
func (f *fifo) msg(t uint64) (id, flags uint8, n uint32) {
	e := f.elem(t)
	return *(*uint8)(unsafe.Add(e, 8)), *(*uint8)(unsafe.Add(e, 9)), atomic.LoadUint32(f.lenp(t))
}

// release frees ticket t's element for ticket t+N (consumer side).
func (f *fifo) release(t uint64) { f.setSeq(t, t+f.n) }

// doorbellName is the abstract unix socket of the iface with this nonce.
// eventfds cannot be reopened through /proc (ENXIO) and pidfd_getfd needs
// ptrace rights, so the doorbell is a datagram socket as in UCX mm.
func doorbellName(pid int, nonce uint64) string {
	return fmt.Sprintf("@gouct-shm-%d-%016x", pid, nonce)
}

func unsafeAdd(p *byte, n int) unsafe.Pointer { return unsafe.Add(unsafe.Pointer(p), n) }
