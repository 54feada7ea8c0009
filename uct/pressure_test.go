package uct

import (
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"
)

func TestParsePressureTotal(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"some avg10=72.67 avg60=85.53 avg300=87.74 total=4887488028\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", 4887488028, true},
		{"some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", 0, true},
		{"full avg10=0.00 avg60=0.00 avg300=0.00 total=5\n", 0, false},
		{"some avg10=0.00 avg60=0.00 avg300=0.00\n", 0, false},
		{"some total=-3\n", 0, false},
		{"some total=12x\n", 0, false},
		{"", 0, false},
	} {
		got, ok := parsePressureTotal([]byte(c.in))
		if got != c.want || ok != c.ok {
			t.Errorf("parsePressureTotal(%q) = %d, %v; want %d, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

// TestSpinOffUnderCPUPressure: with more busy processes than CPUs, and
// spins that keep failing, the worker and blocked Reads stop polling but for
// the odd probe; spins that succeed keep polling on (where the kernel
// reports pressure stall information at all).
func TestSpinOffUnderCPUPressure(t *testing.T) {
	if _, err := os.Stat("/proc/pressure/cpu"); err != nil {
		t.Skip("no /proc/pressure/cpu on this kernel:", err)
	}
	if DefaultConfig().SpinPressure != 0 {
		t.Fatal("the pressure check is opt-in: SpinPressure must default to 0")
	}
	cfg10 := DefaultConfig()
	cfg10.SpinPressure = 10
	w := NewWorker(cfg10)
	defer w.Close()
	pct := w.Config().SpinPressure
	outcomes := func(hit bool) {
		for i := 0; i < 128; i++ {
			w.SpinDone(hit)
		}
	}
	defer outcomes(true) // leave the process-wide state as a quiet host has it
	var hogs []*exec.Cmd
	for i := 0; i < 2*runtime.NumCPU()+1; i++ {
		c := exec.Command("sh", "-c", "while :; do :; done")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		hogs = append(hogs, c)
	}
	defer func() {
		for _, c := range hogs {
			c.Process.Kill()
			c.Wait()
		}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for !cpuPressure.contended(pct) {
		if time.Now().After(deadline) {
			lv, _, _ := CPUPressure()
			t.Fatalf("no pressure seen with %d CPU hogs on %d CPUs (%d‰)", len(hogs), runtime.NumCPU(), lv)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Spins that pay: polling stays on under pressure.
	outcomes(true)
	for i := 0; i < 64; i++ {
		if !w.SpinAllowed() {
			t.Fatal("polling stopped under pressure although spins succeed")
		}
	}
	// Spins that fail: off, but for one probe in probeEvery.
	outcomes(false)
	allowed := 0
	for i := 0; i < 8*probeEvery; i++ {
		if w.SpinAllowed() {
			allowed++
		}
	}
	if allowed < 1 || allowed > 8+1 {
		t.Errorf("%d of %d spins allowed under pressure with failing spins, want about %d probes", allowed, 8*probeEvery, 8)
	}
	if w.spinBudget() != 0 && w.spinBudget() != 0 {
		t.Error("worker spin budget non-zero under pressure with failing spins")
	}
	if lv, miss, off := CPUPressure(); !off || lv <= 0 || miss < 500 {
		t.Errorf("CPUPressure() = %d, %d, %v under pressure with failing spins", lv, miss, off)
	}
	// Disabled (the default): always allowed.
	w2 := NewWorker(nil)
	defer w2.Close()
	if !w2.SpinAllowed() {
		t.Error("SpinPressure=0 still stops polling")
	}
}

// TestSpinPolicy: the decision itself, with the pressure and the miss rate
// set by hand (the hog test above needs a kernel with PSI): polling stops
// only when both are high, the worker of an iface with MinSpin keeps its
// spin, and probes are granted one in probeEvery.
func TestSpinPolicy(t *testing.T) {
	p := &cpuPressure
	saveHigh, saveMiss, saveNext := p.high.Load(), p.missRate.Load(), p.next.Load()
	defer func() { p.high.Store(saveHigh); p.missRate.Store(saveMiss); p.next.Store(saveNext) }()
	p.next.Store(nanotime() + int64(time.Hour)) // no sampling during the test

	cfg := DefaultConfig()
	cfg.SpinPressure = 10
	plain := NewWorker(cfg)
	defer plain.Close()
	// Parked, its loop asks nothing more (its own spinBudget calls would
	// consume probes the test counts).
	waitFor(t, "the worker to park", func() bool { return plain.Sleeps.Load() > 0 })
	soft := NewWorker(cfg)
	defer soft.Close()
	f := &minSpinIface{}
	soft.Add(f)
	defer soft.Remove(f)

	for _, c := range []struct {
		high      bool
		miss      int64
		allowed   bool
		plainSpin bool
	}{
		{false, 0, true, true},
		{false, 1000, true, true}, // spins fail, but the CPUs are free
		{true, 0, true, true},     // pressure, but spins succeed
		{true, 1000, false, false},
	} {
		p.high.Store(c.high)
		p.missRate.Store(c.miss)
		allowed := 0
		for i := 0; i < probeEvery; i++ {
			if plain.SpinAllowed() {
				allowed++
			}
		}
		if c.allowed && allowed != probeEvery || !c.allowed && allowed != 1 {
			t.Errorf("high %v miss %d: %d of %d spins allowed", c.high, c.miss, allowed, probeEvery)
		}
		zero := 0
		for i := 0; i < probeEvery; i++ {
			if plain.spinBudget() == 0 {
				zero++
			}
		}
		if c.plainSpin && zero != 0 || !c.plainSpin && zero != probeEvery-1 {
			t.Errorf("high %v miss %d: worker budget 0 in %d of %d episodes", c.high, c.miss, zero, probeEvery)
		}
		if soft.spinBudget() == 0 {
			t.Errorf("high %v miss %d: the worker of a MinSpin iface stopped spinning", c.high, c.miss)
		}
	}
	// Outcomes move the miss rate both ways.
	p.missRate.Store(0)
	for i := 0; i < 64; i++ {
		plain.SpinDone(false)
	}
	if m := p.missRate.Load(); m < 900 {
		t.Errorf("miss rate %d‰ after 64 misses", m)
	}
	for i := 0; i < 64; i++ {
		plain.SpinDone(true)
	}
	if m := p.missRate.Load(); m > 100 {
		t.Errorf("miss rate %d‰ after 64 hits", m)
	}
}

// minSpinIface is an idle iface that asks waiters to poll (Soft-RoCE-like).
type minSpinIface struct{ Iface }

func (*minSpinIface) Attr() IfaceAttr { return IfaceAttr{MinSpin: 500e-6} }
func (*minSpinIface) Progress() int   { return 0 }
func (*minSpinIface) Arm() bool       { return true }
