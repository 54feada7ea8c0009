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

// TestSpinOffUnderCPUPressure: with more busy processes than CPUs, the
// worker and blocked Reads stop polling within a few samples (where the
// kernel reports pressure stall information at all).
func TestSpinOffUnderCPUPressure(t *testing.T) {
	if _, err := os.Stat("/proc/pressure/cpu"); err != nil {
		t.Skip("no /proc/pressure/cpu on this kernel:", err)
	}
	w := NewWorker(nil)
	defer w.Close()
	if w.Config().SpinPressure <= 0 {
		t.Fatal("SpinPressure default disables the check")
	}
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
	for w.SpinAllowed() {
		if time.Now().After(deadline) {
			lv, _ := CPUPressure()
			t.Fatalf("polling still allowed with %d CPU hogs on %d CPUs (pressure %d‰)", len(hogs), runtime.NumCPU(), lv)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if w.spinBudget() != 0 {
		t.Error("worker spin budget non-zero under pressure")
	}
	if lv, off := CPUPressure(); !off || lv <= 0 {
		t.Errorf("CPUPressure() = %d, %v under pressure", lv, off)
	}
	// Disabled: always allowed.
	cfg := DefaultConfig()
	cfg.SpinPressure = 0
	w2 := NewWorker(cfg)
	defer w2.Close()
	if !w2.SpinAllowed() {
		t.Error("SpinPressure=0 still stops polling")
	}
}
