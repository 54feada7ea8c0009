package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/gouct/gouct/cmd/internal/cliutil"
	"github.com/gouct/gouct/uct"
)

const (
	defaultPort = 13337
	maxSize     = 1 << 30
	maxIters    = 10_000_000
)

var allTests = []string{"am_lat", "am_bw", "put_bw", "get_bw", "stream_lat", "stream_bw"}

// defaultSize is the message size of a test without -s.
func defaultSize(test string) int {
	switch test {
	case "am_lat":
		return 8
	case "am_bw":
		return 4096
	case "put_bw", "get_bw":
		return 64 << 10
	case "stream_lat":
		return 64
	}
	return 1 << 20 // stream_bw
}

type options struct {
	tests   []string
	sizes   []int // nil: each test's default
	iters   int   // 0: auto
	warmup  int   // <0: auto
	tls     []string
	port    int
	host    string
	loop    bool
	compare string
	csv     bool
	json    bool
	plot    string
	forever bool
	quiet   bool
}

func (o *options) sizesFor(test string) []int {
	if o.sizes != nil {
		return o.sizes
	}
	return []int{defaultSize(test)}
}

// plannedIters is the total number of iterations of the client's plan,
// for the progress bar.
func (o *options) plannedIters() int64 {
	var n int64
	for _, t := range o.tests {
		for _, s := range o.sizesFor(t) {
			i, w := o.itersFor(t, s)
			n += int64(i + w)
			if o.compare != "" {
				i, w = o.itersFor(baselineTest(t), s)
				n += int64(i + w)
			}
		}
	}
	return n
}

// itersFor returns iterations and warmup for test at size: -n / -w, or
// enough to move a few tens of MiB, bounded so one step stays short.
func (o *options) itersFor(test string, size int) (iters, warmup int) {
	iters = o.iters
	if iters <= 0 {
		s := max(size, 1)
		if isLat(strings.TrimPrefix(test, "tcp:")) {
			iters = min(max((64<<20)/s, 100), 10_000)
		} else {
			iters = min(max((256<<20)/s, 100), 100_000)
		}
	}
	warmup = o.warmup
	if warmup < 0 {
		warmup = min(max(iters/10, 1), 1000)
	}
	return iters, warmup
}

type command struct {
	stdout, stderr io.Writer
	opt            options
	prof           cliutil.Profiles
	timeout        time.Duration
}

func (c *command) logf(format string, args ...any) {
	fmt.Fprintf(c.stderr, "rdmanet-perf: "+format+"\n", args...)
}

func usage(fs *flag.FlagSet, w io.Writer) {
	fmt.Fprintf(w, `usage: rdmanet-perf [-p port] [-forever]       server
       rdmanet-perf [flags] HOST                 client
       rdmanet-perf -l [flags]                   server and client in this process

Measures gouct latency and bandwidth like ucx_perftest. Tests: %s.
Sizes: comma list with K/M/G suffixes, e.g. -s 8,64,1k,64k,1m.

`, strings.Join(allTests, ", "))
	fs.PrintDefaults()
}

// parse parses args; on a usage error it prints usage to stderr and returns
// code 2 (0 for -h).
func parse(args []string, stdout, stderr io.Writer) (*command, int) {
	c := &command{stdout: stdout, stderr: stderr}
	o := &c.opt
	fs := flag.NewFlagSet("rdmanet-perf", flag.ContinueOnError)
	fs.SetOutput(stderr)
	tests := fs.String("t", "am_lat", "test(s), comma separated: "+strings.Join(allTests, ","))
	sizes := fs.String("s", "", "message size(s), comma separated, K/M/G suffixes (default per test: am_lat 8, am_bw 4K, put/get_bw 64K, stream_lat 64, stream_bw 1M)")
	fs.IntVar(&o.iters, "n", 0, "iterations per size (0: auto, bounded by size)")
	fs.IntVar(&o.warmup, "w", -1, "warmup iterations per size (-1: auto, n/10 up to 1000)")
	tls := fs.String("x", "", "transports to use, like RDMANET_TLS (e.g. shm, tcp, rc_verbs, ^tcp); default: RDMANET_TLS")
	fs.IntVar(&o.port, "p", defaultPort, "TCP port of the server's bootstrap (0: any, server prints it)")
	fs.BoolVar(&o.loop, "l", false, "loopback: run server and client in this process")
	fs.StringVar(&o.compare, "compare", "", "baseline to run beside each step in the same run: tcp")
	fs.BoolVar(&o.csv, "csv", false, "print CSV instead of a table")
	fs.BoolVar(&o.json, "json", false, "print JSON instead of a table")
	fs.StringVar(&o.plot, "plot", "", "write an SVG plot of latency and bandwidth against message size to this file")
	fs.StringVar(&c.prof.CPU, "cpuprofile", "", "write a CPU profile of this process to this file")
	fs.StringVar(&c.prof.Mem, "memprofile", "", "write an allocation profile of this process to this file")
	fs.DurationVar(&c.timeout, "timeout", 60*time.Second, "deadline of each step and bootstrap exchange")
	fs.BoolVar(&o.forever, "forever", false, "server: keep serving clients after the first")
	fs.BoolVar(&o.quiet, "q", false, "no progress bar")
	fs.Usage = func() { usage(fs, stderr) }
	fail := func(format string, args ...any) (*command, int) {
		fmt.Fprintf(stderr, "rdmanet-perf: "+format+"\n", args...)
		usage(fs, stderr)
		return nil, 2
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, 0
		}
		return nil, 2
	}
	switch fs.NArg() {
	case 0:
	case 1:
		o.host = fs.Arg(0)
	default:
		return fail("more than one HOST: %q", fs.Args())
	}
	if o.loop && o.host != "" {
		return fail("-l and HOST exclude each other")
	}
	for _, t := range strings.Split(*tests, ",") {
		t = strings.TrimSpace(t)
		if !contains(allTests, t) {
			return fail("unknown test %q", t)
		}
		o.tests = append(o.tests, t)
	}
	if *sizes != "" {
		for _, s := range strings.Split(*sizes, ",") {
			n, err := uct.ParseSize(strings.TrimSpace(s))
			if err != nil || n < 0 || n > maxSize {
				return fail("bad size %q (0..1G)", s)
			}
			o.sizes = append(o.sizes, int(n))
		}
	}
	if o.iters < 0 || o.iters > maxIters {
		return fail("-n %d out of range (0..%d)", o.iters, maxIters)
	}
	if o.warmup > maxIters {
		return fail("-w %d out of range", o.warmup)
	}
	if *tls != "" {
		for _, s := range strings.Split(*tls, ",") {
			if s = strings.TrimSpace(s); s != "" {
				o.tls = append(o.tls, s)
			}
		}
	}
	if o.port < 0 || o.port > 65535 {
		return fail("-p %d out of range", o.port)
	}
	if o.compare != "" && o.compare != netTCP {
		return fail("-compare %q: only tcp", o.compare)
	}
	if o.csv && o.json {
		return fail("-csv and -json exclude each other")
	}
	if c.timeout <= 0 {
		return fail("-timeout must be positive")
	}
	return c, 0
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
