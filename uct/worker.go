package uct

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Worker is the progress engine (UCX uct_worker). One dedicated goroutine
// per worker polls its ifaces, runs AM handlers and completions, spins for a
// budget after the last event (yielding the processor every few empty polls),
// then arms the ifaces' events and parks: no OS thread blocked, no CPU burnt
// while idle. Transports wake it with Wake from their event sources (fds
// parked in the Go netpoller, socket reader goroutines).
//
// Other goroutines may poll too (TryProgress): a blocked Read polling the
// transport itself is the fastest path for ping-pong traffic. Every poll runs
// under one lock, so handlers never run concurrently with each other. A
// goroutine that spins on TryProgress announces it (BeginPoll/EndPoll); the
// worker then parks without arming until the last such poller stops, so a
// process burns at most one CPU on polling (on 2 vCPUs, a second spinner
// starves the peer process and the kernel's share of the transport).
type Worker struct {
	cfg    *Config
	spin   time.Duration
	mu     sync.Mutex // serialises changes to ifaces
	ifaces atomic.Pointer[[]Iface]
	progMu sync.Mutex // held while polling

	postMu sync.Mutex
	posted []func()
	npost  atomic.Int32

	sleeping  atomic.Bool
	wake      chan struct{} // 1 slot: at most one token per sleep
	closing   atomic.Bool
	done      chan struct{}
	closeOnce sync.Once

	pollers  atomic.Int32 // goroutines spinning on TryProgress (BeginPoll)
	keepSpin atomic.Int32 // attached ifaces with IfaceAttr.MinSpin: poll even under CPU pressure

	wakeAt   atomic.Int64 // monotonic ns of the Wake that ended the last sleep
	wakeCost atomic.Int64 // EWMA of wake-up latency in ns (adapts the spin)

	// Counters for tests and rdmanet-info.
	Sleeps  atomic.Uint64
	Wakeups atomic.Uint64
}

var monoStart = time.Now()

func nanotime() int64 { return int64(time.Since(monoStart)) }

// NewWorker starts a worker and its progress goroutine. cfg nil means DefaultConfig.
func NewWorker(cfg *Config) *Worker {
	if cfg == nil {
		cfg = DefaultConfig()
	}
	w := &Worker{cfg: cfg, spin: cfg.ProgressSpin, wake: make(chan struct{}, 1), done: make(chan struct{})}
	empty := []Iface{}
	w.ifaces.Store(&empty)
	go w.run()
	return w
}

// Config is the worker's configuration.
func (w *Worker) Config() *Config { return w.cfg }

// Add attaches an iface to the worker (transports call it from OpenIface).
func (w *Worker) Add(i Iface) {
	w.mu.Lock()
	old := *w.ifaces.Load()
	n := make([]Iface, len(old), len(old)+1)
	copy(n, old)
	n = append(n, i)
	w.ifaces.Store(&n)
	if i.Attr().MinSpin > 0 {
		w.keepSpin.Add(1)
	}
	w.mu.Unlock()
	w.Wake()
}

// Remove detaches an iface (transports call it from Iface.Close). When it
// returns, the worker no longer polls i.
func (w *Worker) Remove(i Iface) {
	w.mu.Lock()
	old := *w.ifaces.Load()
	n := make([]Iface, 0, len(old))
	for _, x := range old {
		if x != i {
			n = append(n, x)
		} else if i.Attr().MinSpin > 0 {
			w.keepSpin.Add(-1)
		}
	}
	w.ifaces.Store(&n)
	w.mu.Unlock()
	w.progMu.Lock() // wait out a poll that may still hold i
	w.progMu.Unlock()
}

// Post queues fn to run under the progress lock on the next poll and wakes
// the worker. Transports use it to run completions raised on other goroutines.
func (w *Worker) Post(fn func()) {
	w.postMu.Lock()
	w.posted = append(w.posted, fn)
	w.npost.Add(1)
	w.postMu.Unlock()
	w.Wake()
}

// Wake makes a parked worker poll again. It costs one atomic load when the
// worker is not asleep; safe from any goroutine.
func (w *Worker) Wake() {
	if w.sleeping.Load() && w.sleeping.CompareAndSwap(true, false) {
		w.wakeAt.Store(nanotime())
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// BeginPoll announces that the caller is about to spin on TryProgress; the
// worker stops spinning meanwhile. Every BeginPoll needs one EndPoll, and
// the caller must keep polling until then. Safe from any goroutine.
func (w *Worker) BeginPoll() { w.pollers.Add(1) }

// EndPoll ends a BeginPoll. blocking says the caller is about to block: the
// last poller to stop then hands progress back to the worker at once (a
// Wake). A poller that stops because its data arrived does not wake it (the
// wake-up would cost the round trip a futex call and a CPU): the parked
// worker looks again when its timer fires (one spin budget at first,
// doubling to 1 ms while pollers keep polling), by which time a ping-pong
// reader polls again.
func (w *Worker) EndPoll(blocking bool) {
	if w.pollers.Add(-1) == 0 && blocking {
		w.Wake()
	}
}

// SpinAllowed reports whether a goroutine about to block may poll first:
// false while the host's CPUs are oversubscribed (Config.SpinPressure) and
// recent spins mostly ended without their event, when polling steals the
// CPU the awaited event needs; now and then it grants a probe. A caller
// that spins reports the outcome with SpinDone. Safe from any goroutine;
// two atomic loads between pressure samples.
func (w *Worker) SpinAllowed() bool { return cpuPressure.allowSpin(w.cfg.SpinPressure) }

// SpinDone reports how a spin allowed by SpinAllowed ended: hit when its
// event arrived while it polled. Without Config.SpinPressure nothing reads
// the outcome, and nothing is recorded (no shared write per wait).
func (w *Worker) SpinDone(hit bool) {
	if w.cfg.SpinPressure > 0 {
		cpuPressure.spinOutcome(hit)
	}
}

// Progress polls every iface once under the progress lock and returns the
// number of events handled.
func (w *Worker) Progress() int {
	w.progMu.Lock()
	n := w.progressLocked()
	w.progMu.Unlock()
	return n
}

// TryProgress polls like Progress unless another goroutine is polling right
// now; ok reports whether it polled.
func (w *Worker) TryProgress() (n int, ok bool) {
	if !w.progMu.TryLock() {
		return 0, false
	}
	n = w.progressLocked()
	w.progMu.Unlock()
	return n, true
}

func (w *Worker) progressLocked() int {
	n := 0
	if w.npost.Load() != 0 {
		w.postMu.Lock()
		p := w.posted
		w.posted = nil
		w.npost.Store(0)
		w.postMu.Unlock()
		for _, fn := range p {
			fn()
		}
		n += len(p)
	}
	for _, i := range *w.ifaces.Load() {
		n += i.Progress()
	}
	return n
}

// armAll arms every iface under the progress lock: Arm, like Progress, never
// runs concurrently with a poll (TryProgress), nor after Remove returned.
func (w *Worker) armAll() bool {
	if w.npost.Load() != 0 {
		return false
	}
	w.progMu.Lock()
	defer w.progMu.Unlock()
	for _, i := range *w.ifaces.Load() {
		if !i.Arm() {
			return false
		}
	}
	return true
}

// spinBudget adapts the spin to about twice the measured wake-up cost
// (DESIGN.md "Calibration"), never below the configured budget and at most
// 1 ms; 0 while the host's CPUs are oversubscribed (Config.SpinPressure)
// and spins mostly fail, unless an iface asks for polling (IfaceAttr.MinSpin).
// Called once per spin episode (it may grant a probe).
func (w *Worker) spinBudget() int64 {
	s := int64(w.spin)
	if s == 0 || (w.keepSpin.Load() == 0 && !cpuPressure.allowSpin(w.cfg.SpinPressure)) {
		return 0
	}
	if c := 2 * w.wakeCost.Load(); c > s {
		s = min(c, int64(time.Millisecond))
	}
	return s
}

// yieldToPollers parks the worker unarmed, without polling, while other
// goroutines poll: until the last of them blocks (EndPoll wakes us), a Wake
// (a posted func, an event), or a timer finds no poller left, so a poller
// that stopped without blocking is noticed within one spin budget. The
// timer's period doubles (up to 1 ms) while pollers keep polling.
func (w *Worker) yieldToPollers(timer *time.Timer) {
	period := max(w.spin, 10*time.Microsecond)
	for {
		w.sleeping.Store(true)
		if w.pollers.Load() == 0 || w.closing.Load() {
			if !w.sleeping.CompareAndSwap(true, false) {
				<-w.wake
			}
			return
		}
		timer.Reset(period)
		select {
		case <-w.wake:
			timer.Stop()
			return
		case <-timer.C:
			if !w.sleeping.CompareAndSwap(true, false) {
				<-w.wake // a waker owns the token: take it
				return
			}
		}
		if w.pollers.Load() == 0 {
			return
		}
		period = min(2*period, time.Millisecond)
	}
}

func (w *Worker) run() {
	defer close(w.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	last := nanotime()
	empty := 0
	var budget int64
	for !w.closing.Load() {
		if w.Progress() > 0 {
			empty = 0
			last = -1
			continue
		}
		if w.pollers.Load() > 0 {
			w.yieldToPollers(timer)
			empty, last = 0, -1
			continue
		}
		empty++
		if empty&15 != 0 {
			continue
		}
		runtime.Gosched()
		now := nanotime()
		if last < 0 { // the first polls after an event found nothing: spin?
			last = now
			budget = w.spinBudget()
		}
		if now-last < budget {
			continue
		}
		// Park (lost-wakeup safe): announce sleep, arm every iface (each
		// re-checks for pending events), then block; a waker that flips
		// sleeping true->false owns the single token.
		w.sleeping.Store(true)
		if !w.armAll() || w.closing.Load() {
			if !w.sleeping.CompareAndSwap(true, false) {
				<-w.wake
			}
			empty, last = 0, -1
			continue
		}
		w.Sleeps.Add(1)
		<-w.wake
		w.Wakeups.Add(1)
		if at := w.wakeAt.Load(); at > 0 {
			d := nanotime() - at
			old := w.wakeCost.Load()
			w.wakeCost.Store(old + (d-old)/8)
		}
		empty, last = 0, -1
	}
}

// Close stops the progress goroutine and waits for it. Ifaces are not closed:
// their owners close them first.
func (w *Worker) Close() error {
	w.closeOnce.Do(func() {
		w.closing.Store(true)
		w.sleeping.Store(true)
		w.Wake()
		<-w.done
	})
	return nil
}
