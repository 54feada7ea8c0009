package benchclock

import (
	"testing"
	"time"
)

// The counter advances with time and converts to about the wall time.
func TestTicksTrackWallTime(t *testing.T) {
	c := Start()
	a := Ticks()
	time.Sleep(20 * time.Millisecond)
	b := Ticks()
	if b <= a {
		t.Fatalf("ticks did not advance: %d then %d", a, b)
	}
	out := make([]time.Duration, 1)
	if neg := c.Durations([]int64{b - a}, out); neg != 0 {
		t.Fatalf("%d negative", neg)
	}
	if out[0] < 15*time.Millisecond || out[0] > 200*time.Millisecond {
		t.Fatalf("20 ms sleep measured as %v", out[0])
	}
	if neg := c.Durations([]int64{-5}, out); neg != 1 || out[0] != 0 {
		t.Fatalf("negative count: %d, %v", neg, out[0])
	}
}

func BenchmarkTicks(b *testing.B) {
	for i := 0; i < b.N; i++ {
		Ticks()
	}
}

func BenchmarkTimeNow(b *testing.B) {
	for i := 0; i < b.N; i++ {
		time.Now()
	}
}
