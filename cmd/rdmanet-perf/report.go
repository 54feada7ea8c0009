package main

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"os"
	"strconv"

	"github.com/gouct/gouct/cmd/internal/cliutil"
)

// Output is the -json document.
type Output struct {
	Build   cliutil.BuildInfo `json:"build"`
	Server  string            `json:"server"`
	Results []Result          `json:"results"`
}

// write prints results as -csv, -json or a table, and the -plot.
func (c *command) write(rs []Result) error {
	switch {
	case c.opt.json:
		enc := json.NewEncoder(c.stdout)
		enc.SetIndent("", "  ")
		server := c.opt.host
		if c.opt.loop {
			server = "loopback"
		}
		if err := enc.Encode(Output{Build: cliutil.ReadBuildInfo(), Server: server, Results: rs}); err != nil {
			return err
		}
	case c.opt.csv:
		w := csv.NewWriter(c.stdout)
		w.Write([]string{"test", "layer", "transport", "method", "size", "iterations", "warmup",
			"lat_p50_us", "lat_avg_us", "lat_p99_us", "bw_mbs", "msg_rate", "baseline", "vs_tcp", "skipped", "note"})
		for _, r := range rs {
			w.Write([]string{r.Test, r.Layer, r.Transport, r.Method, strconv.Itoa(r.Size), strconv.Itoa(r.Iterations),
				strconv.Itoa(r.Warmup), ff(r.LatP50), ff(r.LatAvg), ff(r.LatP99), ff(r.BW), ff(r.MsgRate),
				strconv.FormatBool(r.Baseline), ff(r.VsTCP), strconv.FormatBool(r.Skipped), r.Note})
		}
		w.Flush()
		if err := w.Error(); err != nil {
			return err
		}
	default:
		c.table(rs)
	}
	if c.opt.plot != "" {
		f, err := os.Create(c.opt.plot)
		if err != nil {
			return fmt.Errorf("plot: %w", err)
		}
		werr := writeSVG(f, rs)
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			return fmt.Errorf("plot: %w", werr)
		}
	}
	return nil
}

func ff(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }

// table prints one row per result, baselines indented under what they
// measure, and notes after the table. Columns are fixed: scripts use -csv
// or -json, people read this.
func (c *command) table(rs []Result) {
	tw, trw := len("test"), len("transport")
	for _, r := range rs {
		tw, trw = max(tw, len(r.Test)+2), max(trw, len(r.Transport))
	}
	fmt.Fprintf(c.stdout, "%-*s  %-*s  %6s  %7s  %8s  %8s  %8s  %9s  %7s  %6s\n", tw, "test", trw, "transport",
		"size", "iters", "p50 µs", "avg µs", "p99 µs", "MB/s", "msg/s", "vs tcp")
	var notes []string
	for _, r := range rs {
		test := r.Test
		if r.Baseline {
			test = "  " + test
		}
		if r.Skipped {
			fmt.Fprintf(c.stdout, "%-*s  %-*s  %6s  %7s  (skipped: see note)\n", tw, test, trw, r.Transport, sizeStr(r.Size), "-")
		} else {
			fmt.Fprintf(c.stdout, "%-*s  %-*s  %6s  %7d  %8s  %8.3f  %8s  %9.1f  %7s  %6s\n", tw, test, trw, r.Transport,
				sizeStr(r.Size), r.Iterations, opt3(r.LatP50), r.LatAvg, opt3(r.LatP99), r.BW, rate(r.MsgRate), ratio(r.VsTCP))
		}
		if r.Note != "" && !contains(notes, r.Note) {
			notes = append(notes, r.Note)
		}
	}
	for _, n := range notes {
		fmt.Fprintf(c.stdout, "note: %s\n", n)
	}
}

func opt3(x float64) string {
	if x == 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f", x)
}

func ratio(x float64) string {
	if x == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", x)
}

func rate(x float64) string {
	switch {
	case x >= 1e6:
		return fmt.Sprintf("%.2fM", x/1e6)
	case x >= 1e3:
		return fmt.Sprintf("%.1fk", x/1e3)
	}
	return fmt.Sprintf("%.0f", x)
}

// sizeStr prints a size with a binary suffix when exact (64K, 1M).
func sizeStr(n int) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dG", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dM", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dK", n>>10)
	}
	return strconv.Itoa(n)
}
