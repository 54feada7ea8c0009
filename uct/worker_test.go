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
	armed   atomic.Bool
}

func (f *fakeIface) Progress() int {
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
