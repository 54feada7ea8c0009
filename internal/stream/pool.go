package stream

import (
	"sync"

	"github.com/gouct/gouct/uct"
)

// chunkSize is the size class of receive buffers: incoming DATA is copied
// into a conn's list of chunks (bounded by its receive window) and the
// reader copies out of them.
const chunkSize = 64 << 10

// chunk is one receive buffer. Only the conn's handler appends (at w, under
// the conn's lock) and only its reader consumes (from r).
type chunk struct {
	buf  []byte
	r, w int
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
	c.r, c.w = 0, 0
	p.mu.Lock()
	if len(p.free) < p.max {
		p.free = append(p.free, c)
	}
	p.mu.Unlock()
}

// rxQueue is a conn's received, unread bytes: a FIFO of chunks. The caller
// holds the conn's lock.
type rxQueue struct {
	q    []*chunk
	head int
	n    int // unread bytes
}

// write appends b, taking chunks from pool as needed.
func (x *rxQueue) write(b []byte, pool *chunkPool) {
	x.n += len(b)
	for len(b) > 0 {
		var t *chunk
		if k := len(x.q); k > x.head && x.q[k-1].w < len(x.q[k-1].buf) {
			t = x.q[k-1]
		} else {
			t = pool.get()
			if x.head > 0 && x.head == len(x.q) {
				x.q, x.head = x.q[:0], 0
			}
			x.q = append(x.q, t)
		}
		k := copy(t.buf[t.w:], b)
		t.w += k
		b = b[k:]
	}
}

// front is the oldest chunk with unread bytes, or nil.
func (x *rxQueue) front() *chunk {
	if x.head < len(x.q) {
		return x.q[x.head]
	}
	return nil
}

// consumed records that n bytes of the front chunk were read; a drained
// chunk goes back to pool unless it is the last (then it is rewound for reuse).
func (x *rxQueue) consumed(c *chunk, n int, pool *chunkPool) {
	c.r += n
	x.n -= n
	if c.r < c.w {
		return
	}
	if x.head == len(x.q)-1 {
		c.r, c.w = 0, 0
		return
	}
	x.q[x.head] = nil
	x.head++
	pool.put(c)
	if x.head > 32 && x.head*2 > len(x.q) {
		k := copy(x.q, x.q[x.head:])
		clear(x.q[k:])
		x.q, x.head = x.q[:k], 0
	}
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
// (MD.MemAlloc) into which readers pull rendezvous data when their own Read
// buffer is too small to be worth registering. Safe for concurrent use.
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
