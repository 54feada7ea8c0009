package rt

import (
	"encoding/json"
	"testing"

	"github.com/gouct/gouct/uct"
)

// The CPU-pressure view of the spin policy is published in the expvar map,
// with the values uct reports.
func TestPressureVars(t *testing.T) {
	got := map[string]int{}
	for _, k := range []string{"cpu_pressure", "spin_miss", "polling_off"} {
		v := vars.Get(k)
		if v == nil {
			t.Fatalf("expvar rdmanet.%s missing", k)
		}
		var n int
		if err := json.Unmarshal([]byte(v.String()), &n); err != nil {
			t.Fatalf("rdmanet.%s = %s: %v", k, v.String(), err)
		}
		got[k] = n
	}
	p, m, off := uct.CPUPressure()
	if got["cpu_pressure"] < 0 || got["cpu_pressure"] > 1000 || got["spin_miss"] < 0 || got["spin_miss"] > 1000 {
		t.Errorf("out of range: %v", got)
	}
	if want := map[bool]int{true: 1, false: 0}[off]; got["polling_off"] != want && p == got["cpu_pressure"] && m == got["spin_miss"] {
		t.Errorf("polling_off = %d, uct says %v", got["polling_off"], off)
	}
}
