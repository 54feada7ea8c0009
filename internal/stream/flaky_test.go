package stream

import (
	"errors"
	"io"
	"math/rand"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gouct/gouct/uct"
)

// flakyEP wraps a real endpoint the way a hardware transport behaves: sends
// and gets fail with ErrNoResource at random (the stream must queue a
// pending request and retry when it fires), and GetZcopy completes
// asynchronously (ErrInProgress, then the Completion on the worker).
type flakyEP struct {
	uct.EP
	w       *uct.Worker
	mu      sync.Mutex
	rng     *rand.Rand
	pending uct.PendingQueue
	armed   bool
	// Counters: the test asserts the hard paths ran.
	fails, asyncGets, pendings atomic.Int64
}

func newFlakyEP(ep uct.EP, w *uct.Worker, seed int64) *flakyEP {
	return &flakyEP{EP: ep, w: w, rng: rand.New(rand.NewSource(seed))}
}

func (f *flakyEP) fail() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rng.Intn(4) == 0 {
		f.fails.Add(1)
		return true
	}
	return false
}

func (f *flakyEP) delay() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return time.Duration(f.rng.Intn(200)) * time.Microsecond
}

func (f *flakyEP) AMShort(id uint8, hdr uint64, payload []byte) error {
	if f.fail() {
		return uct.ErrNoResource
	}
	return f.EP.AMShort(id, hdr, payload)
}

func (f *flakyEP) AMBcopy(id uint8, pack func([]byte) int) (int, error) {
	if f.fail() {
		return 0, uct.ErrNoResource
	}
	return f.EP.AMBcopy(id, pack)
}

func (f *flakyEP) GetZcopy(iov []uct.IOV, raddr uint64, rkey []byte, comp *uct.Completion) error {
	if f.fail() {
		return uct.ErrNoResource
	}
	f.asyncGets.Add(1)
	own := append([]uct.IOV(nil), iov...)
	rk := append([]byte(nil), rkey...)
	time.AfterFunc(f.delay(), func() {
		// The real endpoint may itself complete later (rc_verbs).
		inner := uct.NewCompletion(1, func(st error) { comp.Done(st) })
		if err := f.EP.GetZcopy(own, raddr, rk, inner); !errors.Is(err, uct.ErrInProgress) {
			f.w.Post(func() { comp.Done(err) })
		}
	})
	return uct.ErrInProgress
}

// PendingAdd queues r and "frees resources" a little later: the queue is
// dispatched on the worker, as a transport does on its send completions.
func (f *flakyEP) PendingAdd(r *uct.PendingReq) error {
	f.pendings.Add(1)
	f.pending.Add(r)
	f.mu.Lock()
	arm := !f.armed
	f.armed = true
	f.mu.Unlock()
	if arm {
		time.AfterFunc(f.delay(), func() { f.w.Post(f.dispatch) })
	}
	return nil
}

func (f *flakyEP) dispatch() {
	f.mu.Lock()
	f.armed = false
	f.mu.Unlock()
	f.pending.Dispatch()
	if f.pending.Len() > 0 {
		f.PendingAdd(&uct.PendingReq{Func: func() error { return nil }})
	}
}

func (f *flakyEP) Close() error {
	f.pending.Purge(nil)
	return f.EP.Close()
}

// flakyPair is a started pair whose endpoints are flaky.
func (e *env) flakyPair(t *testing.T) *pair {
	t.Helper()
	c1, _ := e.a.mux.NewConn()
	c2, _ := e.b.mux.NewConn()
	ea, eb, err := connectEPs(e.a, e.b)
	if err != nil {
		t.Fatal(err)
	}
	x, y := net.Pipe()
	f1, f2 := newFlakyEP(ea, e.a.w, 1), newFlakyEP(eb, e.b.w, 2)
	if err := c1.Start(f1, c2.ID(), x, nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := c2.Start(f2, c1.ID(), y, nil, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, f := range []*flakyEP{f1, f2} {
			if f.fails.Load() == 0 || f.asyncGets.Load() == 0 || f.pendings.Load() == 0 {
				t.Errorf("flaky paths not exercised: %d fails, %d async gets, %d pending",
					f.fails.Load(), f.asyncGets.Load(), f.pendings.Load())
			}
		}
	})
	return &pair{c1: c1, c2: c2, ctl1: x, ctl2: y}
}

// TestFlakyTransport: integrity, close and EOF over endpoints that run out
// of resources at random and complete gets asynchronously.
func TestFlakyTransport(t *testing.T) {
	forEachTL(t, func(t *testing.T, tl string) {
		cfg := uct.DefaultConfig()
		cfg.RxWindow = 512 << 10
		e := newEnv(t, tl, cfg)
		p := e.flakyPair(t)
		sizes := integritySizes(e.a.mux)
		total := 8 << 20
		var wg sync.WaitGroup
		res := make([][32]byte, 4)
		errs := make([]error, 4)
		run := func(i int, f func() ([32]byte, error)) {
			wg.Add(1)
			go func() { defer wg.Done(); res[i], errs[i] = f() }()
		}
		run(0, func() ([32]byte, error) { return writeStream(p.c1, 1, total, sizes) })
		run(1, func() ([32]byte, error) { return readStream(p.c2, 2, total, sizes) })
		run(2, func() ([32]byte, error) { return writeStream(p.c2, 3, total, sizes) })
		run(3, func() ([32]byte, error) { return readStream(p.c1, 4, total, sizes) })
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("stream %d: %v", i, err)
			}
		}
		if res[0] != res[1] || res[2] != res[3] {
			t.Fatal("data corrupted: checksums differ")
		}
		t.Logf("c1 %+v", p.c1.Stats())
		// Close under resource shortage still delivers FIN after the data.
		go func() {
			p.c1.Write([]byte("bye"))
			p.c1.Close()
		}()
		buf := make([]byte, 10)
		n, err := readFullOrEOF(p.c2, buf)
		if string(buf[:n]) != "bye" || err != nil {
			t.Fatalf("last bytes %q, %v", buf[:n], err)
		}
		p.c2.Close()
	})
}

func readFullOrEOF(c net.Conn, buf []byte) (int, error) {
	n := 0
	for {
		k, err := c.Read(buf[n:])
		n += k
		if err != nil {
			if err == io.EOF {
				return n, nil
			}
			return n, err
		}
	}
}
