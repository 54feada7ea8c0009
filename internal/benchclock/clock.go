// Package benchclock times the rounds of latency benchmarks the way
// perftest does: by reading the CPU's time-stamp counter, not the system
// clock. In the Soft-RoCE VM (TCG, HPET clock source) a clock_gettime is a
// system call of about 2.3 µs, two per round trip, which perftest's own
// figure does not include; a counter read costs tens of nanoseconds there.
// Counter ticks become nanoseconds by the wall clock measured across the
// whole run (Clock), so no counter frequency is assumed.
package benchclock

import "time"

// Clock relates counter ticks to wall time over a run.
type Clock struct {
	t0 time.Time
	c0 int64
}

// Start starts a run.
func Start() Clock { return Clock{t0: time.Now(), c0: Ticks()} }

// NsPerTick is the nanoseconds per tick over the run so far (call it at
// the end of the run, after a run of at least milliseconds).
func (c Clock) NsPerTick() float64 {
	d := time.Since(c.t0)
	t := Ticks() - c.c0
	if t <= 0 {
		return 1
	}
	return float64(d.Nanoseconds()) / float64(t)
}

// Durations converts per-round tick counts to durations with the run's
// scale. Negative counts (a counter not synchronized across CPUs, seen
// after a migration) become 0, and their number is returned.
func (c Clock) Durations(ticks []int64, out []time.Duration) (negative int) {
	scale := c.NsPerTick()
	for i, t := range ticks {
		if t < 0 {
			negative++
			t = 0
		}
		out[i] = time.Duration(float64(t) * scale)
	}
	return negative
}
