package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"

	"github.com/gouct/gouct/cmd/internal/cliutil"
	_ "github.com/gouct/gouct/cmd/internal/transports"
)

func (c *command) main() int {
	if err := c.prof.Start(); err != nil {
		c.logf("%v", err)
		return 1
	}
	err := c.dispatch()
	if perr := c.prof.Stop(); perr != nil {
		err = errors.Join(err, perr)
	}
	if err != nil {
		c.logf("%v", err)
		return 1
	}
	return 0
}

func (c *command) dispatch() error {
	o := &c.opt
	if o.host == "" && !o.loop {
		ln, err := net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(o.port)))
		if err != nil {
			return err
		}
		defer ln.Close()
		// SIGINT/SIGTERM end the server cleanly, so profiles get written.
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
		defer signal.Stop(sig)
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			select {
			case <-sig:
				ln.Close()
			case <-stop:
			}
		}()
		fmt.Fprintf(c.stdout, "rdmanet-perf: server listening on %s\n", ln.Addr())
		return c.serve(ln, o.forever)
	}
	addr := net.JoinHostPort(o.host, strconv.Itoa(o.port))
	var srvErr chan error
	var loopLn net.Listener
	if o.loop {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		loopLn = ln
		addr = ln.Addr().String()
		srvErr = make(chan error, 1)
		go func() { srvErr <- c.serve(ln, false) }()
	}
	var bar *progressBar
	if f, ok := c.stderr.(*os.File); ok && !o.quiet && cliutil.IsTerminal(f) {
		bar = startProgress(f, o.plannedIters())
	}
	var done *atomic.Int64
	if bar != nil {
		done = &bar.done
	}
	results, err := c.runClient(addr, done)
	if bar != nil {
		bar.stop()
	}
	if srvErr != nil {
		loopLn.Close() // a server still in Accept returns
		if serr := <-srvErr; serr != nil && err == nil {
			err = fmt.Errorf("server: %w", serr)
		}
	}
	if len(results) > 0 {
		if werr := c.write(results); werr != nil {
			err = errors.Join(err, werr)
		}
	}
	if err == nil {
		err = allSkipped(results)
	}
	return err
}

func allSkipped(rs []Result) error {
	for _, r := range rs {
		if !r.Skipped {
			return nil
		}
	}
	if len(rs) == 0 {
		return errors.New("nothing measured")
	}
	return fmt.Errorf("nothing measured: %s", rs[0].Note)
}
