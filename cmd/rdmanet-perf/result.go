package main

import (
	"math"
	"slices"
	"time"
)

// Result is one measured step: one test at one message size over one
// transport. Latencies are one-way (half a round trip for *_lat tests, time
// per message for *_bw tests); p50/p99 only exist for *_lat tests.
// Bandwidth is in MB/s (10^6 bytes per second).
type Result struct {
	Test       string  `json:"test"`
	Layer      string  `json:"layer"`     // uct or conn
	Transport  string  `json:"transport"` // tl/device, or what a Conn ran over
	Method     string  `json:"method,omitempty"`
	Size       int     `json:"size"`
	Iterations int     `json:"iterations"`
	Warmup     int     `json:"warmup"`
	LatP50     float64 `json:"lat_p50_us,omitempty"`
	LatAvg     float64 `json:"lat_avg_us"`
	LatP99     float64 `json:"lat_p99_us,omitempty"`
	BW         float64 `json:"bw_mbs"`
	MsgRate    float64 `json:"msg_rate"`           // messages per second
	Baseline   bool    `json:"baseline,omitempty"` // the -compare tcp run
	VsTCP      float64 `json:"vs_tcp,omitempty"`   // speed-up over the baseline: >1 is faster
	Skipped    bool    `json:"skipped,omitempty"`  // the transport cannot run it (Note says why)
	Note       string  `json:"note,omitempty"`
}

// latResult fills r from half-round-trip samples in ns (sorted in place).
func latResult(r *Result, samples []int64) {
	slices.Sort(samples)
	var sum float64
	for _, s := range samples {
		sum += float64(s)
	}
	n := len(samples)
	avg := sum / float64(n) / 1e3
	r.LatAvg = round3(avg)
	r.LatP50 = round3(float64(samples[pct(n, 50)]) / 1e3)
	r.LatP99 = round3(float64(samples[pct(n, 99)]) / 1e3)
	if avg > 0 {
		r.BW = round3(float64(r.Size) / avg) // bytes per µs = MB/s
		r.MsgRate = math.Round(1e6 / avg)
	}
}

// bwResult fills r from the time iters messages took.
func bwResult(r *Result, d time.Duration) {
	sec := d.Seconds()
	if sec <= 0 {
		sec = 1e-9
	}
	r.LatAvg = round3(sec / float64(r.Iterations) * 1e6)
	r.BW = round3(float64(r.Iterations) * float64(r.Size) / sec / 1e6)
	r.MsgRate = math.Round(float64(r.Iterations) / sec)
}

// pct is the index of the p-th percentile (nearest rank) of n sorted samples.
func pct(n, p int) int {
	i := (n*p + 99) / 100
	return min(max(i-1, 0), n-1)
}

func round3(x float64) float64 { return math.Round(x*1000) / 1000 }

// compare sets r.VsTCP against the baseline: latency ratio for *_lat
// tests (p50), bandwidth ratio for *_bw tests.
func compare(r *Result, base Result) {
	switch {
	case isLat(r.Test) && r.LatP50 > 0 && base.LatP50 > 0:
		r.VsTCP = math.Round(base.LatP50/r.LatP50*100) / 100
	case !isLat(r.Test) && base.BW > 0:
		r.VsTCP = math.Round(r.BW/base.BW*100) / 100
	}
}

func isLat(test string) bool { return test == "am_lat" || test == "stream_lat" }
