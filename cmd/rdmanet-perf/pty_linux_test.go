//go:build linux

package main

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// openPTY returns a pseudo-terminal's master and slave ends.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		m.Close()
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		m.Close()
		t.Fatal(err)
	}
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		m.Close()
		t.Fatal(err)
	}
	return m, s
}

// The progress bar goes to stderr when it is a terminal, and never to stdout.
func TestProgressBarOnTerminal(t *testing.T) {
	var out bytes.Buffer
	tty, code := onTerminal(t, &out, "-l", "-x", "self", "-t", "stream_lat", "-s", "64", "-n", "2000")
	if code != 0 {
		t.Fatalf("exit %d; terminal: %q", code, tty)
	}
	if !strings.Contains(tty, "\r[") || !strings.Contains(tty, "%") || !strings.HasSuffix(tty, "\r\033[K") {
		t.Errorf("no progress bar on the terminal: %q", tty)
	}
	if strings.Contains(out.String(), "[") || !strings.HasPrefix(out.String(), "test") {
		t.Errorf("stdout has more than the table: %q", out.String())
	}
	// -q turns it off.
	if tty, code := onTerminal(t, &out, "-q", "-l", "-x", "self", "-t", "stream_lat", "-n", "2000"); code != 0 || tty != "" {
		t.Errorf("-q: exit %d, terminal got %q", code, tty)
	}
}

// onTerminal runs the command with stderr on a pseudo-terminal and returns
// what the terminal received.
func onTerminal(t *testing.T, stdout *bytes.Buffer, args ...string) (string, int) {
	master, slave := openPTY(t)
	defer master.Close()
	got := make(chan string, 1)
	go func() {
		// Reads end with EIO once the slave side is closed and drained.
		var b bytes.Buffer
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				break
			}
		}
		got <- b.String()
	}()
	code := run(args, stdout, slave)
	slave.Close()
	select {
	case s := <-got:
		return s, code
	case <-time.After(10 * time.Second):
		t.Fatal("terminal reader did not finish")
		return "", code
	}
}
