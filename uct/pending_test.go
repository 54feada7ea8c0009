package uct

import "testing"

// TestPendingDispatchRequeue: a request that queues itself again from its
// Func (no resources yet) must not keep Dispatch looping on the worker.
func TestPendingDispatchRequeue(t *testing.T) {
	var p PendingQueue
	var r PendingReq
	runs := 0
	r.Func = func() error {
		runs++
		p.Add(&r) // still no resources: queued again
		return nil
	}
	p.Add(&r)
	if n := p.Dispatch(); n != 1 || runs != 1 {
		t.Fatalf("Dispatch ran %d (Func %d times), want 1", n, runs)
	}
	if p.Len() != 1 {
		t.Fatalf("Len = %d, want the requeued request", p.Len())
	}
}
