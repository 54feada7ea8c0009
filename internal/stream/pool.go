package stream

import (
	"sync"

	"github.com/gouct/gouct/uct"
)

// chunkSize is the size class of receive buffers: incoming DATA is copied
// into a conn's list of chunks (bounded by its receive window) and the
// reader copies out of them.
const chunkSize = 64 << 10

// chunk is one receive buffer. Only the conn's handler or puller appends
// (at w) and only its reader consumes (from r). A chunk holds either DATA
// bytes, which return credit when read, or rendezvous bytes, which do not.
type chunk struct {
	buf  []byte
	r, w int
	rndv bool
}

// chunkPool is a bounded free list of chunks shared by the conns of a Mux:
// steady traffic reuses chunks instead of allocating. Safe for concurrent use.
type chunkPool struct {
	mu   sync.Mutex
	free []*chunk
	max  int
}

func (p *chunkPool) get() *chunk {
	p.mu.Lock()
	if n := len(p.free); n > 0 {
		c := p.free[n-1]
		p.free[n-1] = nil
		p.free = p.free[:n-1]
		p.mu.Unlock()
		return c
	}
	p.mu.Unlock()
	return &chunk{buf: make([]byte, chunkSize)}
}

func (p *chunkPool) put(c *chunk) {
	c.r, c.w, c.rndv = 0, 0, false
	p.mu.Lock()
	if len(p.free) < p.max {
		p.free = append(p.free, c)
	}
	p.mu.Unlock()
}

// rxQueue is a conn's received, unread bytes in stream order: a FIFO of
// chunks. The caller holds the conn's lock.
type rxQueue struct {
	q    []*chunk
	head int
	n    int // unread bytes
}

// tail returns the chunk to append bytes of kind rndv to: the last chunk if
// it is empty or of that kind with room, else a fresh one from pool.
func (x *rxQueue) tail(rndv bool, pool *chunkPool) *chunk {
	if k := len(x.q); k > x.head {
		t := x.q[k-1]
		if t.w == 0 {
			t.rndv = rndv
			return t
		}
		if t.rndv == rndv && t.w < len(t.buf) {
			return t
		}
	}
	t := pool.get()
	t.rndv = rndv
	if x.head > 0 && x.head == len(x.q) {
		x.q, x.head = x.q[:0], 0
	}
	x.q = append(x.q, t)
	return t
}

// write appends DATA bytes b.
func (x *rxQueue) write(b []byte, pool *chunkPool) {
	x.n += len(b)
	for len(b) > 0 {
		t := x.tail(false, pool)
		k := copy(t.buf[t.w:], b)
		t.w += k
		b = b[k:]
	}
}

// front is the oldest chunk with unread bytes, or nil; drained chunks in
// front of it go back to pool.
func (x *rxQueue) front(pool *chunkPool) *chunk {
	for x.head < len(x.q) {
		c := x.q[x.head]
		if c.r < c.w {
			return c
		}
		if x.head == len(x.q)-1 {
			c.r, c.w = 0, 0 // keep the last one for reuse
			return nil
		}
		x.pop(pool)
	}
	return nil
}

func (x *rxQueue) pop(pool *chunkPool) {
	pool.put(x.q[x.head])
	x.q[x.head] = nil
	x.head++
	if x.head > 32 && x.head*2 > len(x.q) {
		k := copy(x.q, x.q[x.head:])
		clear(x.q[k:])
		x.q, x.head = x.q[:k], 0
	}
}

// consumed records that n bytes of chunk c (the front) were read.
func (x *rxQueue) consumed(c *chunk, n int) {
	c.r += n
	x.n -= n
}

// release returns every chunk to pool.
func (x *rxQueue) release(pool *chunkPool) {
	for i := x.head; i < len(x.q); i++ {
		pool.put(x.q[i])
		x.q[i] = nil
	}
	x.q, x.head, x.n = nil, 0, 0
}

// stagePool is a bounded free list of library-owned, registered buffers
// (MD.MemAlloc) through which rendezvous data is pulled on MDs whose
// zero-copy buffers need a registration (the receive chunks have none).
// Safe for concurrent use.
type stagePool struct {
	md   uct.MD
	size int
	mu   sync.Mutex
	free []uct.Mem
	max  int
}

func (p *stagePool) get() (uct.Mem, error) {
	p.mu.Lock()
	if n := len(p.free); n > 0 {
		m := p.free[n-1]
		p.free = p.free[:n-1]
		p.mu.Unlock()
		return m, nil
	}
	p.mu.Unlock()
	return p.md.MemAlloc(p.size)
}

func (p *stagePool) put(m uct.Mem) {
	p.mu.Lock()
	if len(p.free) < p.max {
		p.free = append(p.free, m)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	p.md.MemFree(m)
}

func (p *stagePool) close() {
	p.mu.Lock()
	f := p.free
	p.free = nil
	p.mu.Unlock()
	for _, m := range f {
		p.md.MemFree(m)
	}
}
