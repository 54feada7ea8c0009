package uct

import (
	"bytes"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// CPU pressure: polling only pays while CPUs are free. When runnable tasks
// already wait for a CPU, a spinning goroutine takes its slice from them (the
// peer process, the kernel's share of the transport, the application's own
// goroutines) and loses the scheduler's favour that a sleeper gets on wake-up:
// under load a spinning transport becomes slower than blocking TCP. Linux
// reports the waiting as pressure stall information (/proc/pressure/cpu,
// "some" total: µs during which at least one runnable task waited for a CPU).
// Pressure alone is not enough: a niced batch job stalls too, yet takes
// nothing from us, and a busy application raises it by itself. So blocked
// Reads and Writes also report how their spins end (the event came, or the
// budget ran out: under real contention the peer cannot answer in time),
// and polling stops only while pressure is above Config.SpinPressure and
// most spins fail; then they and the worker park at once and rely on the
// transports' events, with one spin in probeEvery kept as a probe. (The
// worker's own spins are not counted: one that ends in a park only means
// the traffic paused.)
//
// Sampling is lazy: the first caller after the sample period reads the file
// (one pread on a descriptor kept open), so an idle process reads nothing.

const pressurePeriod = 20 * time.Millisecond

type pressure struct {
	once   sync.Once
	fd     int // /proc/pressure/cpu, -1 when unavailable
	busy   atomic.Bool
	next   atomic.Int64 // nanotime of the next sample
	lastT  int64        // guarded by busy
	lastUs int64
	level  atomic.Int64 // EWMA of the stall share, per mille
	high   atomic.Bool  // above the threshold (with hysteresis)
	buf    [256]byte

	missRate atomic.Int64  // EWMA of spins that ended without their event, per mille
	probes   atomic.Uint32 // spins asked for while polling is off

}

var cpuPressure pressure

func (p *pressure) open() {
	fd, err := syscall.Open("/proc/pressure/cpu", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		fd = -1
	}
	p.fd = fd
}

// readTotal returns the "some" stall total in µs.
func (p *pressure) readTotal() (int64, bool) {
	n, err := syscall.Pread(p.fd, p.buf[:], 0)
	if err != nil || n <= 0 {
		return 0, false
	}
	return parsePressureTotal(p.buf[:n])
}

// parsePressureTotal extracts total= from the "some" line of a PSI file:
// "some avg10=0.00 avg60=0.00 avg300=0.00 total=12345".
func parsePressureTotal(b []byte) (int64, bool) {
	line, _, _ := bytes.Cut(b, []byte{'\n'})
	if !bytes.HasPrefix(line, []byte("some ")) {
		return 0, false
	}
	_, tot, ok := bytes.Cut(line, []byte("total="))
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseInt(string(bytes.TrimSpace(tot)), 10, 64)
	if err != nil || v < 0 {
		return 0, false
	}
	return v, true
}

// sample updates the level from the stall time since the last sample. The
// caller holds busy.
func (p *pressure) sample(now int64, thresholdPermille int64) {
	p.once.Do(p.open)
	if p.fd < 0 {
		p.next.Store(now + int64(time.Hour)) // unavailable: never contended
		return
	}
	p.next.Store(now + int64(pressurePeriod))
	us, ok := p.readTotal()
	if !ok {
		return
	}
	if dt := (now - p.lastT) / 1000; p.lastT != 0 && dt > 0 {
		share := (us - p.lastUs) * 1000 / dt
		share = min(max(share, 0), 1000)
		old := p.level.Load()
		lv := old + (share-old)/2 // reacts within a few samples
		p.level.Store(lv)
		switch {
		case lv > thresholdPermille:
			p.high.Store(true)
		case lv < thresholdPermille/2:
			p.high.Store(false)
		}
	}
	p.lastT, p.lastUs = now, us
}

// contended reports whether CPUs are oversubscribed: the stall share is
// above pct percent (and has not yet fallen below half of it). pct <= 0
// disables the check. Cheap (two atomic loads) between samples; safe from
// any goroutine.
func (p *pressure) contended(pct int) bool {
	if pct <= 0 {
		return false
	}
	now := nanotime()
	if now >= p.next.Load() && p.busy.CompareAndSwap(false, true) {
		p.sample(now, int64(pct)*10)
		p.busy.Store(false)
	}
	return p.high.Load()
}

// probeEvery: while polling is off, one spin request in probeEvery is
// granted, to notice that spins pay again under lasting pressure.
const probeEvery = 16

// allowSpin reports whether a waiter may spin now (see the file comment).
func (p *pressure) allowSpin(pct int) bool {
	if !p.contended(pct) || p.missRate.Load() < 500 {
		return true
	}
	return p.probes.Add(1)%probeEvery == 0
}

// spinOutcome feeds the miss rate; racy updates may lose a sample, which
// an average tolerates.
func (p *pressure) spinOutcome(hit bool) {
	x := int64(1000)
	if hit {
		x = 0
	}
	old := p.missRate.Load()
	p.missRate.Store(old + (x-old)/16)
}

// CPUPressure returns the smoothed share of time, per mille, during which
// runnable tasks on this host waited for a CPU, as last sampled by a
// spinning worker or Read (0 before any sample, or where /proc/pressure/cpu
// does not exist); the share of recent spins, per mille, that ended without
// their event; and whether polling is currently off (both high).
func CPUPressure() (permille, missPermille int, pollingOff bool) {
	p := &cpuPressure
	miss := p.missRate.Load()
	return int(p.level.Load()), int(miss), p.high.Load() && miss >= 500
}
