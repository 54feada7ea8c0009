package uct

import (
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// fakeIface is an Iface whose events are injected by the test.
type fakeIface struct {
	Iface
	w       *Worker
	pending atomic.Int32
	handled atomic.Int32
	polls   atomic.Int64
	armed   atomic.Bool
}

func (f *fakeIface) Attr() IfaceAttr { return IfaceAttr{} }

func (f *fakeIface) Progress() int {
	f.polls.Add(1)
	n := int(f.pending.Swap(0))
	f.handled.Add(int32(n))
	return n
}

func (f *fakeIface) Arm() bool {
	f.armed.Store(true)
	return f.pending.Load() == 0
}

func (f *fakeIface) inject() {
	f.pending.Add(1)
	if f.armed.Swap(false) {
		f.w.Wake()
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func TestWorkerParksAndWakes(t *testing.T) {
	w := NewWorker(DefaultConfig())
	defer w.Close()
	f := &fakeIface{w: w}
	w.Add(f)
	waitFor(t, "first sleep", func() bool { return w.Sleeps.Load() > 0 })

	// Idle: parked, burning (almost) no CPU.
	c0 := cpuTime()
	time.Sleep(300 * time.Millisecond)
	if used := cpuTime() - c0; used > 15*time.Millisecond {
		t.Errorf("idle worker used %v CPU in 300ms", used)
	}
	for i := 1; i <= 100; i++ {
		f.inject()
		waitFor(t, "event handled", func() bool { return f.handled.Load() == int32(i) })
		if i%10 == 0 {
			time.Sleep(2 * time.Millisecond) // let it park again
		}
	}
	if w.Wakeups.Load() == 0 {
		t.Error("worker never woke from a park")
	}
	w.Remove(f)
}

func TestWorkerPost(t *testing.T) {
	w := NewWorker(nil)
	defer w.Close()
	done := make(chan struct{})
	time.Sleep(5 * time.Millisecond)
	w.Post(func() { close(done) })
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("posted func never ran")
	}
}

// TestWorkerYieldsToPoller: while a goroutine announces it polls
// (BeginPoll), the worker neither polls nor arms; the last EndPoll hands
// progress back and events are handled again.
func TestWorkerYieldsToPoller(t *testing.T) {
	w := NewWorker(nil)
	defer w.Close()
	f := &fakeIface{w: w}
	w.Add(f)
	w.BeginPoll()
	w.BeginPoll()
	time.Sleep(20 * time.Millisecond) // the worker notices and parks
	f.armed.Store(false)
	p0 := f.polls.Load()
	c0 := cpuTime()
	time.Sleep(100 * time.Millisecond)
	if n := f.polls.Load() - p0; n > 2 {
		t.Errorf("worker polled %d times while another goroutine polled", n)
	}
	if f.armed.Load() {
		t.Error("worker armed the iface while another goroutine polled")
	}
	if used := cpuTime() - c0; used > 20*time.Millisecond {
		t.Errorf("worker used %v CPU in 100ms while yielding", used)
	}
	w.EndPoll(true)
	f.pending.Add(1) // not armed: only a polling worker sees it
	time.Sleep(20 * time.Millisecond)
	if f.handled.Load() != 0 {
		t.Fatal("worker polled with one poller still announced")
	}
	w.EndPoll(true)
	waitFor(t, "event handled after the last EndPoll", func() bool { return f.handled.Load() == 1 })
	for i := 0; i < 1000; i++ { // racing Begin/End against the park
		w.BeginPoll()
		w.EndPoll(i%2 == 0)
	}
	// A poller that stops without blocking does not wake the worker: it
	// notices within its spin budget.
	w.BeginPoll()
	time.Sleep(5 * time.Millisecond)
	w.EndPoll(false)
	f.pending.Add(1)
	waitFor(t, "event handled after a non-blocking EndPoll", func() bool { return f.handled.Load() == 2 })
	f.inject()
	waitFor(t, "event handled after Begin/End churn", func() bool { return f.handled.Load() == 3 })
	w.Remove(f)
}

func TestWorkerCloseWhileSpinning(t *testing.T) {
	for i := 0; i < 50; i++ {
		w := NewWorker(nil)
		w.Add(&fakeIface{w: w})
		if i%2 == 0 {
			time.Sleep(200 * time.Microsecond)
		}
		w.Close()
		w.Close()
	}
}

func TestCompletion(t *testing.T) {
	var got []error
	c := NewCompletion(3, func(err error) { got = append(got, err) })
	c.Done(nil)
	c.Done(ErrCanceled)
	if len(got) != 0 {
		t.Fatal("fired early")
	}
	c.Done(nil)
	if len(got) != 1 || got[0] != ErrCanceled {
		t.Fatalf("got %v", got)
	}
}

func TestPendingQueue(t *testing.T) {
	var q PendingQueue
	room := 2
	var order []int
	for i := 0; i < 5; i++ {
		i := i
		q.Add(&PendingReq{Func: func() error {
			if room == 0 {
				return ErrNoResource
			}
			room--
			order = append(order, i)
			return nil
		}})
	}
	if n := q.Dispatch(); n != 2 || q.Len() != 3 {
		t.Fatalf("dispatch ran %d, left %d", n, q.Len())
	}
	room = 10
	q.Dispatch()
	if q.Len() != 0 || len(order) != 5 || order[4] != 4 {
		t.Fatalf("order %v", order)
	}
	purged := 0
	q.Add(&PendingReq{Func: func() error { return ErrNoResource }})
	q.Purge(func(*PendingReq) { purged++ })
	if purged != 1 || q.Len() != 0 {
		t.Fatal("purge")
	}
}
