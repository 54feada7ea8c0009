//go:build linux && cgo && !noverbs

package ib

import (
	"fmt"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gouct/gouct/uct"
	"github.com/gouct/gouct/uct/internal/ibv"
)

// seg is one fixed-size buffer of an mpool: off the Go heap, registered.
type seg struct {
	buf  []byte // the whole segment
	addr uint64
	lkey uint32
	id   uint32 // index in its pool
}

// slab is one mmapped, registered region cut into segments.
type slab struct {
	mem  []byte
	mr   *ibv.MR
	segs []seg
}

// mpool is a pool of registered segments that grows by slabs up to a bound
// (the seed's "mpool grow → ibv_reg_mr"). Slabs are only released by Close:
// registered memory is never handed to the Go allocator or a sync.Pool.
// Safe for concurrent use.
type mpool struct {
	name    string
	pd      *ibv.PD
	segSize int
	perSlab int
	maxSegs int
	access  int

	mu     sync.Mutex
	slabs  []*slab
	free   []*seg
	inUse  int
	closed bool // close ran (the device may be gone): no more slabs
}

func newMpool(name string, pd *ibv.PD, segSize, perSlab, maxSegs, access int) *mpool {
	return &mpool{name: name, pd: pd, segSize: segSize, perSlab: max(perSlab, 1),
		maxSegs: max(maxSegs, 1), access: access}
}

// grow adds one slab. Called with mu held.
func (p *mpool) grow() error {
	total := len(p.slabs) * p.perSlab
	n := min(p.perSlab, p.maxSegs-total)
	if n <= 0 || p.closed {
		return uct.ErrNoResource
	}
	size := n * p.segSize
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("ib: %s pool: mmap %d bytes: %w", p.name, size, err)
	}
	mr, err := p.pd.RegMR(uintptr(unsafe.Pointer(&mem[0])), size, p.access)
	if err != nil {
		unix.Munmap(mem)
		return fmt.Errorf("ib: %s pool: %w", p.name, err)
	}
	s := &slab{mem: mem, mr: mr, segs: make([]seg, n)}
	base := uint64(uintptr(unsafe.Pointer(&mem[0])))
	for i := range s.segs {
		off := i * p.segSize
		s.segs[i] = seg{buf: mem[off : off+p.segSize : off+p.segSize], addr: base + uint64(off),
			lkey: mr.LKey, id: uint32(total + i)}
	}
	p.slabs = append(p.slabs, s)
	regSlabs.Add(1)
	for i := n - 1; i >= 0; i-- {
		p.free = append(p.free, &s.segs[i])
	}
	return nil
}

// get returns a free segment, growing the pool if allowed; ErrNoResource
// when the pool is at its bound and every segment is in use.
func (p *mpool) get() (*seg, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, fmt.Errorf("ib: %s pool closed: %w", p.name, uct.ErrClosed)
	}
	if len(p.free) == 0 {
		if err := p.grow(); err != nil {
			return nil, err
		}
	}
	s := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	p.inUse++
	return s, nil
}

// put returns s to the pool.
func (p *mpool) put(s *seg) {
	p.mu.Lock()
	if !p.closed { // after close the memory is unmapped: drop it
		p.free = append(p.free, s)
	}
	p.inUse--
	p.mu.Unlock()
}

// available reports whether get would succeed now.
func (p *mpool) available() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.free) > 0 || (!p.closed && len(p.slabs)*p.perSlab < p.maxSegs)
}

// close deregisters and unmaps every slab; segments must not be in use by
// the device any more.
func (p *mpool) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var first error
	for _, s := range p.slabs {
		if err := s.mr.Close(); err != nil && first == nil {
			first = err
		}
		if err := unix.Munmap(s.mem); err != nil && first == nil {
			first = err
		}
		regSlabs.Add(-1)
	}
	p.slabs, p.free, p.closed = nil, nil, true
	return first
}
