package uct

import "sync"

// PendingQueue is a FIFO of PendingReq for transports to embed in their
// endpoints (UCX ucs_arbiter, simplified to one queue per EP). Safe for
// concurrent use.
type PendingQueue struct {
	mu sync.Mutex
	q  []*PendingReq
}

// Add appends r.
func (p *PendingQueue) Add(r *PendingReq) {
	p.mu.Lock()
	p.q = append(p.q, r)
	p.mu.Unlock()
}

// Len is the number of queued requests.
func (p *PendingQueue) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.q)
}

// Dispatch runs queued requests in order until one returns ErrNoResource
// (it stays at the head) or the queue is empty. It returns how many ran to
// completion. Requests that return another error are removed as well.
// Call it from the worker when resources free up.
//
// Dispatch runs at most the requests queued when it was called: a request
// queued meanwhile (a Func that finds no resources and queues itself again
// with PendingAdd) waits for the next Dispatch, instead of looping on the
// worker that would free the resources.
func (p *PendingQueue) Dispatch() int {
	p.mu.Lock()
	budget := len(p.q)
	p.mu.Unlock()
	n := 0
	for ; budget > 0; budget-- {
		p.mu.Lock()
		if len(p.q) == 0 {
			p.mu.Unlock()
			return n
		}
		r := p.q[0]
		p.mu.Unlock()
		if err := r.Func(); err == ErrNoResource {
			return n
		}
		p.mu.Lock()
		if len(p.q) > 0 && p.q[0] == r {
			p.q[0] = nil
			p.q = p.q[1:]
		}
		p.mu.Unlock()
		n++
	}
	return n
}

// Purge removes every request, calling cb (if non-nil) on each.
func (p *PendingQueue) Purge(cb func(*PendingReq)) {
	p.mu.Lock()
	q := p.q
	p.q = nil
	p.mu.Unlock()
	if cb != nil {
		for _, r := range q {
			cb(r)
		}
	}
}
