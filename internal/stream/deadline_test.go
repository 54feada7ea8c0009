package stream

import (
	"testing"
	"testing/synctest"
	"time"
)

// TestDeadlineHelper checks the net.Pipe-style deadline in fake time.
func TestDeadlineHelper(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDeadline()
		defer d.stop()
		ch := d.wait()
		if closedChan(ch) {
			t.Fatal("no deadline, but expired")
		}
		// A future deadline expires on time, not before.
		d.set(time.Now().Add(time.Second))
		time.Sleep(999 * time.Millisecond)
		if closedChan(d.wait()) {
			t.Fatal("expired early")
		}
		time.Sleep(2 * time.Millisecond)
		if !closedChan(ch) {
			t.Fatal("the waiters' channel did not close at the deadline")
		}
		// Clearing it gives a fresh, open channel.
		d.set(time.Time{})
		if closedChan(d.wait()) {
			t.Fatal("cleared deadline still expired")
		}
		// Extending a pending deadline keeps the waiters' channel: they
		// wake at the new time.
		ch = d.wait()
		d.set(time.Now().Add(time.Second))
		d.set(time.Now().Add(3 * time.Second))
		if d.wait() != ch {
			t.Fatal("extending replaced the channel blocked calls wait on")
		}
		time.Sleep(2 * time.Second)
		if closedChan(ch) {
			t.Fatal("fired at the old deadline")
		}
		time.Sleep(2 * time.Second)
		if !closedChan(ch) {
			t.Fatal("did not fire at the new deadline")
		}
		// A past deadline wakes blocked waiters at once.
		d.set(time.Time{})
		ch = d.wait()
		woke := make(chan struct{})
		go func() { <-ch; close(woke) }()
		synctest.Wait()
		d.set(time.Unix(1, 0))
		synctest.Wait()
		select {
		case <-woke:
		default:
			t.Fatal("a past deadline did not wake the waiter")
		}
	})
}
