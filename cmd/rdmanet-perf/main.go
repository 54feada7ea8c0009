// Command rdmanet-perf measures gouct's latency and bandwidth between two
// processes, as ucx_perftest does for UCX: start a server, then a client
// naming it; they bootstrap over TCP and run the tests the client asks for.
//
//	rdmanet-perf [-p port]                         server: one session, then exit (-forever: keep serving)
//	rdmanet-perf [flags] HOST                      client
//	rdmanet-perf -l [flags]                        both in this process (loopback; reaches the self transport)
//
// Tests at the uct level (transport chosen like the library does, or forced
// with -x / RDMANET_TLS): am_lat (AM short ping-pong, bcopy above MaxShort),
// am_bw (AM bcopy stream), put_bw and get_bw (zero-copy RMA against the
// server's registered buffer; rkey sent over the bootstrap). At the Conn
// level: stream_lat (echo) and stream_bw (large writes). -compare tcp runs
// the same traffic over Go TCP in the same run and prints the speed-up.
//
// Output: a table on stdout (-csv, -json for scripts; -plot out.svg draws
// latency and bandwidth against message size), a progress bar on stderr when
// it is a terminal. -cpuprofile / -memprofile work on both sides. Exit
// status: 0 on success, 1 on a failed run, 2 on a usage error.
package main

import (
	"io"
	"os"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the whole command, for tests: args without the program name.
func run(args []string, stdout, stderr io.Writer) int {
	c, code := parse(args, stdout, stderr)
	if c == nil {
		return code
	}
	return c.main()
}
