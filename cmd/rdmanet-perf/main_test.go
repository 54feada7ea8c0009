package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/csv"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gouct/gouct/rdmanet"
	"github.com/gouct/gouct/uct"
	"go.uber.org/goleak"
)

// childEnv makes the test binary act as rdmanet-perf itself (the server
// process of the two-process tests), with the arguments in the variable.
const childEnv = "RDMANET_PERF_TEST_ARGS"

func TestMain(m *testing.M) {
	if a, ok := os.LookupEnv(childEnv); ok {
		os.Exit(run(strings.Fields(a), os.Stdout, os.Stderr))
	}
	// rdmanet's runtime (worker, ifaces) lives as long as the process:
	// start it first and ignore exactly its goroutines, so a worker or
	// iface this command leaks is still caught.
	if err := startRDMARuntime(); err != nil {
		fmt.Fprintln(os.Stderr, "start rdmanet runtime:", err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m, goleak.IgnoreCurrent())
}

func startRDMARuntime() error {
	ln, err := rdmanet.Listen("rdma", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := rdmanet.Dial("rdma", ln.Addr().String())
	if err != nil {
		return err
	}
	c.Close()
	time.Sleep(100 * time.Millisecond) // let the accept goroutine finish
	return nil
}

func runPerf(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return out.String(), errb.String(), code
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-bogus"}, {"-t", "nope", "h"}, {"-s", "12q", "h"}, {"-s", "2G", "h"}, {"-compare", "udp", "h"},
		{"-csv", "-json", "h"}, {"-l", "h"}, {"a", "b"}, {"-n", "-5", "h"}, {"-p", "70000"}, {"-timeout", "0s", "h"},
	} {
		out, errs, code := runPerf(t, args...)
		if code != 2 || out != "" || !strings.Contains(errs, "usage: rdmanet-perf") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want 2 and usage on stderr", args, code, out, errs)
		}
	}
	if _, _, code := runPerf(t, "-h"); code != 0 {
		t.Errorf("-h: exit %d, want 0", code)
	}
}

func TestLoopbackJSONAndPlot(t *testing.T) {
	svg := filepath.Join(t.TempDir(), "out.svg")
	out, errs, code := runPerf(t, "-l", "-json", "-compare", "tcp", "-plot", svg, "-x", "self",
		"-t", "am_lat,am_bw,put_bw,get_bw,stream_lat,stream_bw", "-s", "8,1k", "-n", "200", "-w", "10")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var doc Output
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if doc.Server != "loopback" || doc.Build.GoVersion == "" {
		t.Errorf("header: server %q build %+v", doc.Server, doc.Build)
	}
	// 6 tests × 2 sizes, each with its Go TCP baseline.
	if len(doc.Results) != 24 {
		t.Fatalf("%d results, want 24", len(doc.Results))
	}
	for i, r := range doc.Results {
		if r.Baseline != (i%2 == 1) {
			t.Errorf("result %d: baseline=%v", i, r.Baseline)
		}
		if r.Skipped || r.Iterations != 200 || r.Warmup != 10 || r.LatAvg <= 0 || r.BW <= 0 || r.MsgRate <= 0 {
			t.Errorf("result %d incomplete: %+v", i, r)
		}
		if isLat(r.Test) && !(r.LatP50 > 0 && r.LatP50 <= r.LatP99) {
			t.Errorf("result %d: p50 %v p99 %v", i, r.LatP50, r.LatP99)
		}
		if !r.Baseline && r.VsTCP <= 0 {
			t.Errorf("result %d: no ratio against tcp: %+v", i, r)
		}
		if r.Layer == "uct" && (r.Transport != "self/memory" || r.Method == "") {
			t.Errorf("result %d: uct test on %q method %q, want self/memory", i, r.Transport, r.Method)
		}
		if r.Baseline && (r.Transport != "go-tcp" || r.Layer != "conn") {
			t.Errorf("result %d: baseline on %q", i, r.Transport)
		}
		// -x self rules rdmanet too: in one process the Conn runs on self.
		if !r.Baseline && r.Layer == "conn" && (r.Transport != "rdma:self" || r.Note != "") {
			t.Errorf("result %d: Conn test on %q (%s), want rdma:self", i, r.Transport, r.Note)
		}
	}
	if r := doc.Results[0]; r.Test != "am_lat" || r.Method != "short" || r.Size != 8 {
		t.Errorf("first result %+v, want am_lat 8 B short", r)
	}
	b, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(bytes.NewReader(b))
	paths := 0
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("plot is not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "path" {
			paths++
		}
	}
	// One line per (test, transport): 6 tests + 2 baselines, latency tests
	// in the latency panel, bandwidth tests in the bandwidth panel.
	if paths != 8 {
		t.Errorf("plot has %d lines, want 8", paths)
	}
}

func TestLoopbackCSVAndSkips(t *testing.T) {
	out, errs, code := runPerf(t, "-l", "-csv", "-x", "self", "-t", "am_lat", "-s", "64,1m", "-n", "100")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	rows, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 || rows[0][0] != "test" || len(rows[0]) != 16 {
		t.Fatalf("csv: %q", rows)
	}
	if rows[1][4] != "64" || rows[1][14] != "false" || rows[2][4] != "1048576" || rows[2][14] != "true" ||
		!strings.Contains(rows[2][15], "max bcopy") {
		t.Errorf("want 64 B measured and 1 MiB skipped (above max bcopy): %q", rows[1:])
	}
	// Nothing measurable is a failure, not an empty success.
	if _, errs, code := runPerf(t, "-l", "-q", "-x", "self", "-t", "am_bw", "-s", "1m"); code != 1 || !strings.Contains(errs, "nothing measured") {
		t.Errorf("all skipped: exit %d, %q", code, errs)
	}
	// A transport list that leaves nothing is an error.
	if _, errs, code := runPerf(t, "-l", "-q", "-x", "nosuch", "-n", "10"); code != 1 || !strings.Contains(errs, "no transport") {
		t.Errorf("-x nosuch: exit %d, %q", code, errs)
	}
}

func TestTable(t *testing.T) {
	out, errs, code := runPerf(t, "-l", "-x", "self", "-t", "am_lat,stream_lat", "-s", "8", "-n", "100", "-compare", "tcp")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if !strings.HasPrefix(lines[0], "test") || !strings.Contains(lines[0], "p50 µs") || !strings.Contains(lines[0], "vs tcp") {
		t.Fatalf("header: %q", lines[0])
	}
	if !strings.HasPrefix(lines[1], "am_lat") || !strings.HasPrefix(lines[2], "  stream_lat") || !strings.HasSuffix(lines[1], "x") {
		t.Errorf("rows:\n%s", out)
	}
	if errs != "" {
		t.Errorf("stderr not a terminal, yet: %q", errs)
	}
}

func TestProfiles(t *testing.T) {
	dir := t.TempDir()
	cpu, mem := filepath.Join(dir, "cpu.pprof"), filepath.Join(dir, "mem.pprof")
	if _, errs, code := runPerf(t, "-l", "-q", "-x", "self", "-n", "100", "-cpuprofile", cpu, "-memprofile", mem); code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, f := range []string{cpu, mem} {
		if st, err := os.Stat(f); err != nil || st.Size() == 0 {
			t.Errorf("profile %s: %v", f, err)
		}
	}
}

// startServer runs rdmanet-perf -p 0 as a separate process and returns the
// address it listens on.
func startServer(t *testing.T, args ...string) (string, *exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"="+strings.Join(append([]string{"-p", "0"}, args...), " "))
	var errb bytes.Buffer
	cmd.Stderr = &errb
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("server: %v (%s)", err, errb.String())
	}
	const prefix = "rdmanet-perf: server listening on "
	if !strings.HasPrefix(line, prefix) {
		t.Fatalf("server said %q", line)
	}
	_, port, err := net.SplitHostPort(strings.TrimSpace(strings.TrimPrefix(line, prefix)))
	if err != nil {
		t.Fatal(err)
	}
	return port, cmd, &errb
}

// interProcess lists the registered transports that can reach another process.
func interProcess() []string {
	var out []string
	for _, ci := range uct.Components() {
		if ci.Err == nil && ci.Component.Name() != "self" {
			out = append(out, ci.Component.Name())
		}
	}
	return out
}

func TestTwoProcesses(t *testing.T) {
	dir := t.TempDir()
	cpu := filepath.Join(dir, "server-cpu.pprof")
	port, srv, srvErr := startServer(t, "-cpuprofile", cpu)
	out, errs, code := runPerf(t, "-p", port, "-json", "-t", "stream_lat,am_lat", "-s", "64", "-n", "300", "127.0.0.1")
	tps := interProcess()
	if len(tps) == 0 {
		// Only the in-process self transport is built in: the uct test
		// cannot reach another process and must say so.
		if code != 1 || !strings.Contains(errs, "no common transport") {
			t.Fatalf("self only: exit %d, stderr %q; want failure naming no common transport", code, errs)
		}
	} else if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var doc Output
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if len(doc.Results) == 0 || doc.Results[0].Test != "stream_lat" || doc.Results[0].LatP50 <= 0 {
		t.Fatalf("stream_lat missing: %+v", doc.Results)
	}
	if slices.Contains(tps, "shm") && doc.Results[0].Transport != "rdma:shm" {
		t.Errorf("stream_lat between processes ran on %q (%s), want rdma:shm", doc.Results[0].Transport, doc.Results[0].Note)
	}
	if len(tps) > 0 {
		if len(doc.Results) != 2 {
			t.Fatalf("results %+v", doc.Results)
		}
		r := doc.Results[1]
		if r.Test != "am_lat" || r.LatP50 <= 0 || strings.HasPrefix(r.Transport, "self/") {
			t.Fatalf("am_lat between processes: %+v (transports %v)", r, tps)
		}
		t.Logf("am_lat over %s: p50 %.2f µs; stream_lat over %s: p50 %.2f µs", r.Transport, r.LatP50,
			doc.Results[0].Transport, doc.Results[0].LatP50)
	}
	// The server serves one session, then exits and writes its profile.
	werr := make(chan error, 1)
	go func() { werr <- srv.Wait() }()
	select {
	case err := <-werr:
		var ee *exec.ExitError
		if len(tps) > 0 && err != nil || err != nil && !errors.As(err, &ee) {
			t.Fatalf("server: %v: %s", err, srvErr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("server did not exit after the session")
	}
	if st, err := os.Stat(cpu); err != nil || st.Size() == 0 {
		t.Errorf("server cpu profile: %v", err)
	}
}

// A hostile or broken client must not crash or wedge the server.
func TestServerRejectsGarbage(t *testing.T) {
	for name, payload := range map[string][]byte{
		"huge frame":   {0xff, 0xff, 0xff, 0xff},
		"bad json":     append([]byte{0, 0, 0, 3}, "{{{"...),
		"bad version":  frame(&msg{Op: opHello, Version: 99}),
		"wrong op":     frame(&msg{Op: opRun}),
		"bad run":      append(frame(&msg{Op: opHello, Version: protoVersion}), frame(&msg{Op: opRun, Layer: "uct", Iters: -1})...),
		"pick no open": append(frame(&msg{Op: opHello, Version: protoVersion}), frame(&msg{Op: opUCTPick, Index: 5})...),
	} {
		t.Run(name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			c := &command{stdout: io.Discard, stderr: io.Discard, timeout: 5 * time.Second}
			done := make(chan error, 1)
			go func() { done <- c.serve(ln, false) }()
			conn, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.Write(payload)
			select {
			case err := <-done:
				if err == nil {
					t.Fatal("server accepted garbage")
				}
			case <-time.After(10 * time.Second):
				t.Fatal("server wedged")
			}
		})
	}
}

func frame(m *msg) []byte {
	b, _ := json.Marshal(m)
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...)
}

func TestStats(t *testing.T) {
	s := make([]int64, 100)
	for i := range s {
		s[i] = int64(100-i) * 1000 // 100 µs … 1 µs, unsorted
	}
	r := Result{Size: 1000}
	latResult(&r, s)
	if r.LatP50 != 50 || r.LatP99 != 99 || r.LatAvg != 50.5 || r.BW != round3(1000/50.5) {
		t.Errorf("got %+v", r)
	}
	r = Result{Size: 1 << 20, Iterations: 1000}
	bwResult(&r, time.Second)
	if r.BW != 1048.576 || r.MsgRate != 1000 || r.LatAvg != 1000 {
		t.Errorf("got %+v", r)
	}
	a := Result{Test: "am_lat", LatP50: 2}
	compare(&a, Result{LatP50: 30})
	b := Result{Test: "am_bw", BW: 6000}
	compare(&b, Result{BW: 3000})
	if a.VsTCP != 15 || b.VsTCP != 2 {
		t.Errorf("ratios %v %v", a.VsTCP, b.VsTCP)
	}
}

// Every transport that reaches another process runs the uct tests it
// supports between two processes when forced with -x.
func TestTwoProcessesEachTransport(t *testing.T) {
	tps := interProcess()
	if os.Getenv("RXEVM") == "1" && !slices.Contains(tps, "ib") {
		// In the Soft-RoCE VM (scripts/vm-test.sh) rc_verbs must be there.
		t.Fatalf("RXEVM=1 but the ib component is unavailable: %v", uct.Components())
	}
	if len(tps) == 0 {
		t.Skip("no inter-process transport built in (self only)")
	}
	port, _, srvErr := startServer(t, "-forever")
	for _, tp := range tps {
		t.Run(tp, func(t *testing.T) {
			out, errs, code := runPerf(t, "-p", port, "-json", "-x", tp, "-t", "am_lat,am_bw,put_bw,get_bw", "-s", "8,4k", "-n", "300", "127.0.0.1")
			if code != 0 {
				t.Fatalf("exit %d: %s (server: %s)", code, errs, srvErr.String())
			}
			var doc Output
			if err := json.Unmarshal([]byte(out), &doc); err != nil {
				t.Fatalf("not JSON: %v\n%s", err, out)
			}
			if len(doc.Results) != 8 {
				t.Fatalf("%d results, want 8", len(doc.Results))
			}
			prefix := tp + "/"
			if tp == "ib" {
				prefix = "rc_verbs/"
			}
			for _, r := range doc.Results {
				if !strings.HasPrefix(r.Transport, prefix) {
					t.Errorf("%s %d B ran on %q, want %s", r.Test, r.Size, r.Transport, tp)
				}
				rma := r.Test == "put_bw" || r.Test == "get_bw"
				if r.Skipped {
					if !rma || !strings.Contains(r.Note, "not supported") {
						t.Errorf("%s %d B skipped: %s", r.Test, r.Size, r.Note)
					}
					continue
				}
				if r.LatAvg <= 0 || r.BW <= 0 {
					t.Errorf("%s %d B: %+v", r.Test, r.Size, r)
				}
				t.Logf("%-7s %5d B over %-12s avg %8.3f µs  %9.1f MB/s", r.Test, r.Size, r.Transport, r.LatAvg, r.BW)
			}
			// The Conn level honours -x too: rdmanet runs on that transport,
			// or falls back to raw TCP (it does not run tcp as a uct
			// transport) and says why.
			out, errs, code = runPerf(t, "-p", port, "-json", "-x", tp, "-t", "stream_lat,stream_bw", "-s", "64", "-n", "200", "127.0.0.1")
			if code != 0 {
				t.Fatalf("stream tests: exit %d: %s (server: %s)", code, errs, srvErr.String())
			}
			doc = Output{}
			if err := json.Unmarshal([]byte(out), &doc); err != nil {
				t.Fatalf("not JSON: %v\n%s", err, out)
			}
			want := map[string]string{"shm": "rdma:shm", "tcp": "rdma:tcp", "ib": "rdma:rc_verbs/"}[tp]
			for _, r := range doc.Results {
				if !strings.HasPrefix(r.Transport, want) || r.LatAvg <= 0 || (tp == "tcp") != strings.Contains(r.Note, "fell back to TCP") {
					t.Errorf("%s over -x %s: transport %q note %q, want %s", r.Test, tp, r.Transport, r.Note, want)
				}
			}
		})
	}
}

func TestProgressBar(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "tty"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := startProgress(f, 1000)
	p.done.Store(500)
	time.Sleep(450 * time.Millisecond)
	p.stop()
	b, _ := os.ReadFile(f.Name())
	s := string(b)
	if !strings.Contains(s, "\r["+strings.Repeat("=", 20)+strings.Repeat(" ", 20)+"]  50%") || !strings.HasSuffix(s, "\r\033[K") {
		t.Errorf("bar output %q", s)
	}
}

func TestPlotOneKind(t *testing.T) {
	var b bytes.Buffer
	rs := []Result{
		{Test: "am_lat", Transport: "shm/memory", Size: 8, LatP50: 0.5, LatAvg: 0.6, BW: 16},
		{Test: "am_lat", Transport: "shm/memory", Size: 1 << 20, Skipped: true},
		{Test: "am_lat", Transport: "shm/memory", Size: 4096, LatP50: 0.9, LatAvg: 1, BW: 4096},
	}
	if err := writeSVG(&b, rs); err != nil {
		t.Fatal(err)
	}
	svg := b.String()
	// Only latency tests: the one series is drawn in both panels, skipped sizes left out.
	if n := strings.Count(svg, "<path "); n != 2 {
		t.Errorf("%d lines, want 2:\n%s", n, svg)
	}
	if n := strings.Count(svg, "<circle "); n != 4 {
		t.Errorf("%d points, want 4", n)
	}
	if !strings.Contains(svg, ">4K<") || !strings.Contains(svg, ">8<") {
		t.Errorf("size axis lacks 8 or 4K labels:\n%s", svg)
	}
	b.Reset()
	if err := writeSVG(&b, nil); err != nil || !strings.Contains(b.String(), "no results") {
		t.Errorf("empty plot: %v %q", err, b.String())
	}
}

// A -forever server ends cleanly on SIGINT and writes its profiles.
func TestServerSignal(t *testing.T) {
	dir := t.TempDir()
	cpu, mem := filepath.Join(dir, "cpu"), filepath.Join(dir, "mem")
	port, srv, srvErr := startServer(t, "-forever", "-cpuprofile", cpu, "-memprofile", mem)
	if _, errs, code := runPerf(t, "-p", port, "-q", "-t", "stream_lat", "-n", "50", "127.0.0.1"); code != 0 {
		t.Fatalf("client: exit %d: %s", code, errs)
	}
	if err := srv.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	werr := make(chan error, 1)
	go func() { werr <- srv.Wait() }()
	select {
	case err := <-werr:
		if err != nil {
			t.Fatalf("server: %v: %s", err, srvErr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("server ignored SIGINT")
	}
	for _, f := range []string{cpu, mem} {
		if st, err := os.Stat(f); err != nil || st.Size() == 0 {
			t.Errorf("profile %s: %v", f, err)
		}
	}
}

// A peer that dies mid-step ends the step at once on the other side: the
// server goes on to its next client, the client reports the failure; neither
// waits for the step's deadline.
func TestPeerDiesMidStep(t *testing.T) {
	for _, test := range []string{"stream_lat", "am_lat"} {
		t.Run("client dies/"+test, func(t *testing.T) {
			port, _, srvErr := startServer(t, "-forever")
			cl := exec.Command(os.Args[0])
			cl.Env = append(os.Environ(), childEnv+"=-p "+port+" -q -t "+test+" -n 10000000 -s 64 127.0.0.1")
			if err := cl.Start(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(700 * time.Millisecond)
			cl.Process.Kill()
			cl.Wait()
			start := time.Now()
			if _, errs, code := runPerf(t, "-p", port, "-q", "-t", test, "-n", "100", "-s", "64", "127.0.0.1"); code != 0 {
				t.Fatalf("next client: exit %d: %s (server: %s)", code, errs, srvErr.String())
			}
			if d := time.Since(start); d > 15*time.Second {
				t.Errorf("next client waited %v for the server", d)
			}
		})
		t.Run("server dies/"+test, func(t *testing.T) {
			port, srv, _ := startServer(t)
			go func() {
				time.Sleep(700 * time.Millisecond)
				srv.Process.Kill()
			}()
			start := time.Now()
			_, errs, code := runPerf(t, "-p", port, "-q", "-t", test, "-n", "10000000", "-s", "64", "127.0.0.1")
			if code != 1 || errs == "" {
				t.Fatalf("exit %d, stderr %q: want 1 with the reason", code, errs)
			}
			if d := time.Since(start); d > 15*time.Second {
				t.Errorf("client took %v to notice", d)
			}
		})
	}
}
