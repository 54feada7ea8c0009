package rdmanet_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gouct/gouct/internal/rt"
	"github.com/gouct/gouct/rdmanet"
	"github.com/gouct/gouct/uct/ib"
)

// rc_verbs faults in the Soft-RoCE VM: a QP forced to the error state, and
// the RDMA device removed (rdma link delete) while conns are open. Both
// skip on hosts without an RDMA port and fail in the VM (RXEVM=1).

const devGoneRole = "rcverbs-devgone"

func init() { childRoles[devGoneRole] = devGoneChild }

// faultBound is how long a conn may take to notice a fault: well under a
// second on real hardware; the race detector under TCG is ~20x slower.
const faultBound = 5 * time.Second

// newQPs returns the QPs in after and not in before.
func newQPs(before, after []ib.TestingQP) []ib.TestingQP {
	var out []ib.TestingQP
	for _, q := range after {
		if !slices.Contains(before, q) {
			out = append(out, q)
		}
	}
	return out
}

// echoOnce writes n random bytes on a and checks b reads them, then the
// same from b to a.
func echoOnce(a, b net.Conn, n int) error {
	if err := sendCheck(a, b, n); err != nil {
		return err
	}
	return sendCheck(b, a, n)
}

// sendCheck writes n random bytes on w (concurrently) and checks that r
// reads exactly them within 30 s.
func sendCheck(w, r net.Conn, n int) error {
	src := make([]byte, n)
	for i := range src {
		src[i] = byte(rand.Uint32())
	}
	werr := make(chan error, 1)
	go func() { _, err := w.Write(src); werr <- err }()
	got := make([]byte, n)
	r.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, err := io.ReadFull(r, got)
	r.SetReadDeadline(time.Time{})
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	if err := <-werr; err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if !bytes.Equal(got, src) {
		return errors.New("echo corrupted")
	}
	return nil
}

// waitLiveRegs waits (≤ 5 s) for the live per-operation registrations to
// come back to base, and returns the last value.
func waitLiveRegs(base int64) int64 {
	end := time.Now().Add(5 * time.Second)
	for {
		live := rdmanet.ReadCounters().RegistrationsLive
		if live <= base || time.Now().After(end) {
			return live
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// result is a blocked call's outcome and when it came.
type result struct {
	err error
	at  time.Time
}

func blockedRead(c net.Conn) chan result {
	ch := make(chan result, 1)
	go func() {
		buf := make([]byte, 64<<10)
		for {
			_, err := c.Read(buf)
			if err != nil {
				ch <- result{err, time.Now()}
				return
			}
		}
	}()
	return ch
}

// clearErr checks a faulted call's error: present, not a clean EOF or a
// deadline, and within faultBound of the fault.
func clearErr(t *testing.T, what string, ch chan result, fault time.Time) {
	t.Helper()
	select {
	case r := <-ch:
		took := r.at.Sub(fault)
		switch {
		case r.err == nil, r.err == io.EOF, errors.Is(r.err, os.ErrDeadlineExceeded):
			t.Errorf("%s: %v, want a conn error", what, r.err)
		case took > faultBound:
			t.Errorf("%s failed only %v after the fault (bound %v): %v", what, took, faultBound, r.err)
		default:
			t.Logf("%s failed %v after the fault: %v", what, took.Round(time.Millisecond), r.err)
		}
	case <-time.After(faultBound + 10*time.Second):
		t.Errorf("%s still blocked %v after the fault", what, faultBound+10*time.Second)
	}
}

// TestRCVerbsQPError: the QP of one live conn is moved to the error state
// (ib.TestingForceQPError). Its blocked Read and Write fail promptly with a
// conn error; the peer conn fails too (at once if it touches the dead QP,
// else once the failed conn is closed); a conn on the same iface keeps
// echoing, the listener keeps accepting rc_verbs conns, and the live
// registrations return to their baseline.
func TestRCVerbsQPError(t *testing.T) {
	c := rcVerbsConfig(t)
	l := listenRXE(t, c)
	defer l.Close()
	start := time.Now()
	stage := func(s string) { t.Logf("%6.2fs %s", time.Since(start).Seconds(), s) }
	base := rdmanet.ReadCounters().RegistrationsLive
	b1, b2, err := pipe(l, c)
	if err != nil {
		t.Fatal(err)
	}
	defer b1.Close()
	defer b2.Close()
	before := ib.TestingEndpointQPs()
	v1, v2, err := pipe(l, c)
	if err != nil {
		t.Fatal(err)
	}
	defer v1.Close()
	defer v2.Close()
	wantRC(t, v1)
	wantRC(t, b1)
	// Rendezvous-sized writes both ways first: per-operation registrations.
	if err := echoOnce(v1, v2, 4<<20); err != nil {
		t.Fatal(err)
	}
	stage("victim conn echoed 4 MiB")
	if err := echoOnce(b1, b2, 1<<20); err != nil {
		t.Fatal(err)
	}
	stage("other conn echoed 1 MiB (before the fault)")
	// In creation order: the dialer prepares its endpoint before the
	// Hello, so the first is v1's.
	qps := newQPs(before, ib.TestingEndpointQPs())
	if len(qps) != 2 {
		t.Fatalf("the new conn pair added QPs %v, want 2 (client and server)", qps)
	}
	// v1: a Read (v2 never writes) and a Write (v2 does not read: the
	// window fills) blocked when the fault hits.
	rd := blockedRead(v1)
	wr := make(chan result, 1)
	go func() {
		_, err := v1.Write(make([]byte, 64<<20))
		wr <- result{err, time.Now()}
	}()
	time.Sleep(300 * time.Millisecond)
	select {
	case r := <-wr:
		t.Fatalf("64 MiB Write to a peer that does not read returned: %v", r.err)
	default:
	}
	stage("conns ready, v1's Read and Write blocked")
	fault := time.Now()
	if err := ib.TestingForceQPError(qps[0]); err != nil {
		t.Fatal(err)
	}
	clearErr(t, "blocked Read", rd, fault)
	clearErr(t, "blocked Write", wr, fault)
	// The peer fails when it touches v1's dead QP (it pulls v1's pending
	// rendezvous write, if the RTS left before the fault: the READ gets no
	// answer), else when v1 is closed, as an application does on an
	// error: the liveness channel tells it.
	pr := blockedRead(v2)
	select {
	case r := <-pr:
		t.Logf("peer failed before the victim's Close: %v", r.err)
		pr <- r
	case <-time.After(time.Second):
	}
	closed := time.Now()
	v1.Close()
	clearErr(t, "peer Read (bound from the victim's Close)", pr, closed)
	if _, err := v2.Write([]byte("x")); err == nil {
		t.Error("peer Write after the fault: no error")
	}
	stage("faulted conns failed")
	// Another conn on the same iface is unaffected.
	if err := echoOnce(b1, b2, 1<<20); err != nil {
		t.Errorf("other conn after the fault: %v", err)
	}
	stage("other conn echoed 1 MiB (after the fault)")
	// The listener keeps accepting rc_verbs conns.
	n1, n2, err := pipe(l, c)
	if err != nil {
		t.Fatalf("dial after the fault: %v", err)
	}
	wantRC(t, n1)
	wantRC(t, n2)
	if err := echoOnce(n1, n2, 1<<20); err != nil {
		t.Errorf("new conn after the fault: %v", err)
	}
	stage("new conn echoed")
	for _, x := range []net.Conn{n1, n2, v1, v2, b1, b2} {
		x.Close()
	}
	if live := waitLiveRegs(base); live > base {
		t.Errorf("live registrations %d after closing every conn, baseline %d", live, base)
	}
	stage(fmt.Sprintf("closed; registrations %+v", ib.Registrations()))
}

// Device removal runs in a child process: the process-wide runtime opens
// its devices once, and this test's device must exist when it does.

// TestRCVerbsDeviceRemoved: a dedicated Soft-RoCE device (rxef0 on the
// dummy netdev gouctf0, 10.79.0.1) is removed with `rdma link delete`
// while conns over it are open. The child process (devGoneChild) checks
// that the conns fail with a clear error, the removal completes (the
// process lets go of the device), nothing panics, new Dials to the same
// listener fall back to TCP with the reason in Stats and the fallbacks
// counter, the dead transport is no longer offered, and the live
// registrations return to their baseline.
func TestRCVerbsDeviceRemoved(t *testing.T) {
	rcVerbsConfig(t)
	for _, tool := range []string{"ip", "rdma"} {
		if _, err := exec.LookPath(tool); err != nil || os.Geteuid() != 0 {
			if os.Getenv("RXEVM") == "1" {
				t.Fatalf("RXEVM=1 but %s or root missing: %v", tool, err)
			}
			t.Skipf("needs root and %s", tool)
		}
	}
	const netdev, dev, ip = "gouctf0", "rxef0", "10.79.0.1"
	run := func(args ...string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := run("ip", "link", "add", netdev, "type", "dummy"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := os.Stat("/sys/class/infiniband/" + dev); err == nil {
			run("rdma", "link", "delete", dev)
		}
		if err := run("ip", "link", "del", netdev); err != nil {
			t.Error(err)
		}
	})
	for _, args := range [][]string{
		{"ip", "addr", "add", ip + "/24", "dev", netdev},
		{"ip", "link", "set", netdev, "up"},
		{"rdma", "link", "add", dev, "type", "rxe", "netdev", netdev},
	} {
		if err := run(args...); err != nil {
			t.Fatal(err)
		}
	}
	// Wait for the RoCE v2 GID of the IP.
	want := net.ParseIP(ip).To16()
	end := time.Now().Add(10 * time.Second)
	for found := false; !found; {
		ents, _ := os.ReadDir("/sys/class/infiniband/" + dev + "/ports/1/gids")
		for _, e := range ents {
			g, err := os.ReadFile("/sys/class/infiniband/" + dev + "/ports/1/gids/" + e.Name())
			if err == nil && net.ParseIP(strings.TrimSpace(string(g))).Equal(want) {
				found = true
			}
		}
		if !found && time.Now().After(end) {
			t.Fatalf("no GID for %s on %s after 10 s", ip, dev)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cmd := startChild(t, devGoneRole, "RDMANET_NET_DEVICES="+dev+":1", "RDMANET_TLS=rc_verbs,tcp",
		"TEST_FAULT_IP="+ip, "TEST_FAULT_DEV="+dev)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	var lines []string
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines = append(lines, sc.Text())
		}
		done <- cmd.Wait()
	}()
	var werr error
	select {
	case werr = <-done:
	case <-time.After(180 * time.Second):
		cmd.Process.Kill()
		<-done
		werr = errors.New("child hung (killed after 180 s)")
	}
	ok := false
	for _, ln := range lines {
		switch {
		case strings.HasPrefix(ln, "FAIL: "):
			t.Error(strings.TrimPrefix(ln, "FAIL: "))
		case ln == "DONE":
			ok = true
		default:
			t.Log(ln)
		}
	}
	if werr != nil || !ok {
		t.Errorf("child: %v (finished: %v)", werr, ok)
	}
}

// devGoneChild is TestRCVerbsDeviceRemoved's process: it reports on
// stdout ("FAIL: ..." for a failed check, "DONE" at the end).
func devGoneChild() {
	var mu sync.Mutex
	failf := func(format string, a ...any) {
		mu.Lock()
		fmt.Printf("FAIL: "+format+"\n", a...)
		mu.Unlock()
	}
	logf := func(format string, a ...any) {
		mu.Lock()
		fmt.Printf(format+"\n", a...)
		mu.Unlock()
	}
	die := func(format string, a ...any) {
		failf(format, a...)
		os.Exit(1)
	}
	ip, dev := os.Getenv("TEST_FAULT_IP"), os.Getenv("TEST_FAULT_DEV")
	c := &rdmanet.Config{TLS: []string{"rc_verbs", "tcp"}}
	lc := rdmanet.ListenConfig{Config: c}
	l, err := lc.Listen(context.Background(), "rdma", net.JoinHostPort(ip, "0"))
	if err != nil {
		die("listen: %v", err)
	}
	defer l.Close()
	go serveEcho(l)
	resolved, err := rt.Resolve(c)
	if err != nil {
		die("%v", err)
	}
	r := rt.Get(resolved)
	want := "rc_verbs/" + dev + ":1"
	if got := rt.Offered(r.Allowed(resolved), false); got != want {
		die("transports %q, want %q only (skipped: %v)", got, want, r.Skipped)
	}
	base := rdmanet.ReadCounters()
	d := &rdmanet.Dialer{Config: c, Timeout: 20 * time.Second}
	ctx := context.Background()
	var conns []net.Conn
	for k := range 3 {
		conn, err := dialMode(ctx, d, l.Addr().String(), 'E', want)
		if err != nil {
			die("dial %d: %v", k, err)
		}
		conns = append(conns, conn)
		// 1 MiB writes: rendezvous, per-operation registrations.
		if err := echoMode(conn, 1<<20); err != nil {
			die("echo %d before the removal: %v", k, err)
		}
	}
	var reads []chan result
	for _, conn := range conns {
		reads = append(reads, blockedRead(conn))
	}
	time.Sleep(100 * time.Millisecond)
	logf("%d conns on %s, live registrations %d (baseline %d); removing %s", len(conns), want,
		rdmanet.ReadCounters().RegistrationsLive, base.RegistrationsLive, dev)
	fault := time.Now()
	del := make(chan error, 1)
	go func() {
		out, err := exec.Command("rdma", "link", "delete", dev).CombinedOutput()
		if err != nil {
			err = fmt.Errorf("%v: %s", err, out)
		}
		del <- err
	}()
	for k, ch := range reads {
		select {
		case res := <-ch:
			took := res.at.Sub(fault)
			if res.err == nil || res.err == io.EOF || took > faultBound {
				failf("conn %d Read: %v after %v", k, res.err, took)
			} else {
				logf("conn %d Read failed %v after the removal began: %v", k, took.Round(time.Millisecond), res.err)
			}
		case <-time.After(faultBound + 20*time.Second):
			die("conn %d Read still blocked %v after the removal began", k, faultBound+20*time.Second)
		}
	}
	select {
	case err := <-del:
		if err != nil {
			failf("rdma link delete: %v", err)
		}
		logf("rdma link delete returned %v after it began", time.Since(fault).Round(time.Millisecond))
	case <-time.After(60 * time.Second):
		die("rdma link delete still blocked after 60 s: the process did not let go of the device")
	}
	if _, err := conns[0].Write([]byte("x")); err == nil {
		failf("Write on a conn of the removed device: no error")
	}
	// The dead transport is no longer offered; new Dials fall back to TCP.
	var failed error
	for _, tr := range r.Transports {
		if tr.Name() == want {
			failed = tr.Failed()
		}
	}
	if failed == nil {
		failf("transport %s not reported failed", want)
	} else {
		logf("transport %s: %v", want, failed)
	}
	if got := r.Allowed(resolved); len(got) != 0 {
		failf("still allowed after the removal: %s", rt.Offered(got, false))
	}
	for k := range 2 {
		conn, err := dialMode(ctx, d, l.Addr().String(), 'E', "tcp")
		if err != nil {
			failf("dial %d after the removal: %v", k, err)
			continue
		}
		st := conn.(rdmanet.Conn).Stats()
		if !strings.Contains(st.Fallback, "transport failed") {
			failf("fallback conn %d: reason in Stats %q, want \"transport failed\"", k, st.Fallback)
		} else {
			logf("dial %d after the removal: %s, fallback %q", k, st.Transport, st.Fallback)
		}
		if err := echoMode(conn, 256<<10); err != nil {
			failf("echo over the fallback conn %d: %v", k, err)
		}
		conn.Close()
	}
	fb := rdmanet.ReadCounters().Fallbacks
	grew := false
	for reason, n := range fb {
		if n > base.Fallbacks[reason] {
			grew = true
			logf("fallbacks[%q] = %d (was %d)", reason, n, base.Fallbacks[reason])
		}
	}
	if !grew {
		failf("fallbacks counter did not grow: %v (was %v)", fb, base.Fallbacks)
	}
	for _, conn := range conns {
		conn.Close()
	}
	if live := waitLiveRegs(base.RegistrationsLive); live > base.RegistrationsLive {
		failf("live registrations %d after closing every conn, baseline %d", live, base.RegistrationsLive)
	}
	logf("registrations after: %+v", ib.Registrations())
	fmt.Println("DONE")
}

// echoMode writes n random bytes on a conn of serveEcho in mode 'E' and
// checks the echo.
func echoMode(c net.Conn, n int) error { return sendCheck(c, c, n) }
