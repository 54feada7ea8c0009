//go:build linux

package shm

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gouct/gouct/uct"
)

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// Two-process tests re-execute the test binary as the peer (peerMain),
// selected by this environment variable. The two processes exchange
// addresses as text lines over the child's stdin/stdout.
const peerEnv = "GOUCT_SHM_TEST_PEER"

// AM ids between the test and its peer.
const (
	amEcho  = 1 // peer echoes the message back unchanged (AMShort)
	amBulk  = 2 // peer hashes the payload
	amEnd   = 3 // peer replies amEnd: hdr = bytes hashed, payload = sha256
	amSink  = 4 // peer counts the bytes
	amFlood = 5 // peer -> test: flood traffic
	amCount = 6 // peer replies amCount: hdr = bytes counted by amSink since the last amCount
	amStamp = 7 // peer replies amStamp: hdr = CLOCK_MONOTONIC ns when its handler ran
)

// monotonic is CLOCK_MONOTONIC in ns: comparable between processes.
func monotonic() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

const rmaLen = 1 << 20

func rmaPattern(i int) byte { return byte(i*7 + 3) }

func openPlain(cfg *uct.Config, p uct.IfaceParams) (*side, error) {
	c, _ := uct.LookupComponent(componentName)
	md, err := c.OpenMD(mdName, cfg)
	if err != nil {
		return nil, err
	}
	w := uct.NewWorker(cfg)
	p.Config = cfg
	ifc, err := md.OpenIface(w, uct.TLResource{TL: tlName, Device: deviceName, Type: uct.DeviceShm}, p)
	if err != nil {
		w.Close()
		return nil, err
	}
	return &side{w: w, md: md, iface: ifc.(*iface)}, nil
}

// retry sends until the transport takes the message, waiting on a pending
// request (the cross-process pending path) whenever the peer FIFO is full.
func retry(ep uct.EP, send func() error) error {
	for {
		err := send()
		if !errors.Is(err, uct.ErrNoResource) {
			return err
		}
		ch := make(chan struct{}, 1)
		err = ep.PendingAdd(&uct.PendingReq{Func: func() error { ch <- struct{}{}; return nil }})
		if errors.Is(err, uct.ErrBusy) {
			continue
		}
		if err != nil {
			return err
		}
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			return fmt.Errorf("pending request not dispatched in 10 s")
		}
	}
}

// peerMain is the child process: an echo/hash server over shm plus a TCP
// echo server for baselines. Its protocol on stdout: "addr <dev> <iface>",
// "rma <rkey> <addr>", "tcp <addr>", then after it reads "addr ..." on
// stdin, "connected". Commands on stdin: "flood" starts sending amFlood to
// the test; EOF closes everything.
func peerMain(role string) int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "peer:", err); return 2 }
	if path := os.Getenv(peerEnv + "_CPUPROFILE"); path != "" { // profile the receiving side
		if f, err := os.Create(path); err == nil && pprof.StartCPUProfile(f) == nil {
			defer pprof.StopCPUProfile()
		}
	}
	cfg, err := uct.ConfigFromEnv() // RDMANET_* tune the peer only
	if err != nil {
		return fail(err)
	}
	s, err := openPlain(cfg, uct.IfaceParams{})
	if err != nil {
		return fail(err)
	}
	defer s.close()
	buf := make([]byte, rmaLen)
	for i := range buf {
		buf[i] = rmaPattern(i)
	}
	mh, err := s.md.Register(buf, uct.AccessRemoteRead|uct.AccessRemoteWrite)
	if err != nil {
		return fail(err)
	}
	rk, _ := s.md.PackRKey(mh)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail(err)
	}
	defer lis.Close()
	go tcpServer(lis)
	fmt.Printf("addr %x %x\nrma %x %d\ntcp %s\n", s.iface.DeviceAddress(), s.iface.IfaceAddress(),
		rk, uint64(uintptrOf(buf)), lis.Addr())

	in := bufio.NewScanner(os.Stdin)
	var ep uct.EP
	var h hash.Hash = sha256.New()
	var hashed uint64
	send := func(fn func() error) {
		for i := 0; ; i++ {
			err := fn()
			if err == nil || !errors.Is(err, uct.ErrNoResource) || i > 1e6 {
				return
			}
			runtime.Gosched()
		}
	}
	s.iface.SetAMHandler(amEcho, func(d []byte) {
		hdr := binary.LittleEndian.Uint64(d)
		for i := 0; errors.Is(ep.AMShort(amEcho, hdr, d[8:]), uct.ErrNoResource) && i < 1e6; i++ {
			runtime.Gosched()
		}
	})
	s.iface.SetAMHandler(amStamp, func([]byte) {
		now := uint64(monotonic())
		send(func() error { return ep.AMShort(amStamp, now, nil) })
	})
	var sunk uint64
	s.iface.SetAMHandler(amSink, func(d []byte) { sunk += uint64(len(d)) })
	s.iface.SetAMHandler(amCount, func([]byte) {
		n := sunk
		sunk = 0
		send(func() error { return ep.AMShort(amCount, n, nil) })
	})
	s.iface.SetAMHandler(amBulk, func(d []byte) { h.Write(d); hashed += uint64(len(d)) })
	s.iface.SetAMHandler(amEnd, func([]byte) {
		sum := h.Sum(nil)
		n := hashed
		h.Reset()
		hashed = 0
		send(func() error { return ep.AMShort(amEnd, n, sum) })
	})
	var flood sync.WaitGroup
	stop := make(chan struct{})
	defer func() { close(stop); flood.Wait() }()
	for in.Scan() {
		f := strings.Fields(in.Text())
		switch {
		case len(f) == 3 && f[0] == "addr":
			dev, _ := hex.DecodeString(f[1])
			ifa, _ := hex.DecodeString(f[2])
			if ep, err = s.iface.CreateEP(uct.EPParams{DevAddr: dev, IfaceAddr: ifa}); err != nil {
				return fail(err)
			}
			fmt.Println("connected")
		case len(f) == 1 && f[0] == "flood":
			flood.Add(1)
			go func() {
				defer flood.Done()
				for i := uint64(0); ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					if ep.AMShort(amFlood, i, nil) != nil {
						runtime.Gosched()
					}
				}
			}()
		}
	}
	runtime.KeepAlive(buf)
	return 0
}

// tcpServer serves the TCP baselines: mode 'p' echoes 8-byte messages;
// mode 'b' reads an 8-byte length, that many bytes, and acks with one byte.
func tcpServer(lis net.Listener) {
	for {
		c, err := lis.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			var mode [1]byte
			if _, err := io.ReadFull(c, mode[:]); err != nil {
				return
			}
			buf := make([]byte, 1<<16)
			for {
				switch mode[0] {
				case 'p':
					if _, err := io.ReadFull(c, buf[:8]); err != nil {
						return
					}
					if _, err := c.Write(buf[:8]); err != nil {
						return
					}
				case 'b':
					if _, err := io.ReadFull(c, buf[:8]); err != nil {
						return
					}
					n := int64(binary.LittleEndian.Uint64(buf))
					if _, err := io.CopyBuffer(io.Discard, io.LimitReader(c, n), buf); err != nil {
						return
					}
					if _, err := c.Write(buf[:1]); err != nil {
						return
					}
				default:
					return
				}
			}
		}()
	}
}

// peer is a running child process connected both ways to a test side.
type peer struct {
	cmd            *exec.Cmd
	in             io.WriteCloser
	out            *bufio.Scanner
	dev, ifa, rkey []byte
	raddr          uint64
	tcp            string
	ep             uct.EP // test -> peer
	exited         bool
}

func startPeer(tb testing.TB, s *side) *peer {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), peerEnv+"=peer")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	p := &peer{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	tb.Cleanup(func() { p.stop(tb) })
	p.expect(tb, "addr", func(f []string) {
		p.dev, _ = hex.DecodeString(f[1])
		p.ifa, _ = hex.DecodeString(f[2])
	})
	p.expect(tb, "rma", func(f []string) {
		p.rkey, _ = hex.DecodeString(f[1])
		fmt.Sscan(f[2], &p.raddr)
	})
	p.expect(tb, "tcp", func(f []string) { p.tcp = f[1] })
	if !s.iface.IsReachable(p.dev, p.ifa) {
		tb.Fatal("peer process unreachable")
	}
	if p.ep, err = s.iface.CreateEP(uct.EPParams{DevAddr: p.dev, IfaceAddr: p.ifa}); err != nil {
		tb.Fatal(err)
	}
	fmt.Fprintf(in, "addr %x %x\n", s.iface.DeviceAddress(), s.iface.IfaceAddress())
	p.expect(tb, "connected", func([]string) {})
	return p
}

func (p *peer) expect(tb testing.TB, word string, fn func([]string)) {
	tb.Helper()
	if !p.out.Scan() {
		tb.Fatalf("peer exited before %q: %v", word, p.out.Err())
	}
	f := strings.Fields(p.out.Text())
	if len(f) == 0 || f[0] != word {
		tb.Fatalf("peer said %q, want %q", p.out.Text(), word)
	}
	fn(f)
}

// stop closes the peer's stdin and waits for it to exit cleanly.
func (p *peer) stop(tb testing.TB) {
	if p.exited {
		return
	}
	p.exited = true
	if p.ep != nil {
		p.ep.Close()
	}
	p.in.Close()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			tb.Errorf("peer process: %v", err)
		}
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-done
		tb.Errorf("peer process did not exit")
	}
}

func TestTwoProcessPingPong(t *testing.T) {
	s := openSide(t, nil, uct.IfaceParams{})
	p := startPeer(t, s)
	var got atomic.Uint64
	var bad atomic.Int32
	s.iface.SetAMHandler(amEcho, func(d []byte) {
		if len(d) != 8+64 || d[8] != byte(binary.LittleEndian.Uint64(d)) {
			bad.Add(1)
		}
		got.Store(binary.LittleEndian.Uint64(d))
	})
	payload := make([]byte, 64)
	for i := uint64(1); i <= 2000; i++ {
		payload[0] = byte(i)
		if err := retry(p.ep, func() error { return p.ep.AMShort(amEcho, i, payload) }); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for got.Load() != i {
			if time.Now().After(deadline) {
				t.Fatalf("no echo of %d", i)
			}
			runtime.Gosched()
		}
		if i%500 == 0 {
			time.Sleep(5 * time.Millisecond) // let both workers park: exercises the doorbell
		}
	}
	if bad.Load() != 0 {
		t.Fatalf("%d corrupted echoes", bad.Load())
	}
	if s.w.Sleeps.Load() == 0 {
		t.Error("worker never parked between bursts")
	}
}

// Bulk data of every size and send kind, checksummed by the peer, with the
// peer's FIFO filling up (pending requests) along the way.
func TestTwoProcessBulk(t *testing.T) {
	s := openSide(t, nil, uct.IfaceParams{})
	p := startPeer(t, s)
	type result struct {
		n   uint64
		sum []byte
	}
	res := make(chan result, 1)
	s.iface.SetAMHandler(amEnd, func(d []byte) {
		res <- result{binary.LittleEndian.Uint64(d), append([]byte(nil), d[8:]...)}
	})
	h := sha256.New()
	var total uint64
	data := make([]byte, 8192)
	attr := s.iface.Attr()
	for i := 0; i < 6000; i++ {
		n := (i*7919 + 13) % (attr.MaxBcopy + 1)
		for k := range data[:n] {
			data[k] = byte(i + k*31)
		}
		var err error
		switch i % 3 {
		case 0:
			err = retry(p.ep, func() error {
				_, err := p.ep.AMBcopy(amBulk, func(b []byte) int { return copy(b, data[:n]) })
				return err
			})
		case 1:
			m := min(n, attr.MaxShort+8)
			if m < 8 {
				m = 8
			}
			n = m
			err = retry(p.ep, func() error {
				return p.ep.AMShort(amBulk, binary.LittleEndian.Uint64(data), data[8:m])
			})
		case 2:
			hdrLen := min(n, 16)
			err = retry(p.ep, func() error {
				return p.ep.AMZcopy(amBulk, data[:hdrLen], []uct.IOV{{Buf: data[hdrLen : hdrLen+(n-hdrLen)/2]}, {Buf: data[hdrLen+(n-hdrLen)/2 : n]}}, nil)
			})
		}
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		h.Write(data[:n])
		total += uint64(n)
	}
	if err := retry(p.ep, func() error { return p.ep.AMShort(amEnd, 0, nil) }); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-res:
		if r.n != total || string(r.sum) != string(h.Sum(nil)) {
			t.Fatalf("peer hashed %d bytes (%x), sent %d (%x)", r.n, r.sum, total, h.Sum(nil))
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no checksum from peer")
	}
}

func TestTwoProcessRMA(t *testing.T) {
	s := openSide(t, nil, uct.IfaceParams{})
	if err := rmaSupported(); err != nil {
		if s.iface.Attr().Cap.Has(uct.CapGetZcopy) {
			t.Fatal("get_zcopy advertised though the probe failed")
		}
		t.Skipf("cross-process memory access unavailable: %v", err)
	}
	p := startPeer(t, s)
	local := make([]byte, rmaLen)
	iov := []uct.IOV{{Buf: local[:12345]}, {}, {Buf: local[12345:]}}
	if err := p.ep.GetZcopy(iov, p.raddr, p.rkey, nil); err != nil {
		t.Fatal(err)
	}
	for i, b := range local {
		if b != rmaPattern(i) {
			t.Fatalf("byte %d: %#x, want %#x", i, b, rmaPattern(i))
		}
	}
	put := make([]byte, 8192)
	for i := range put {
		put[i] = byte(i ^ 0x5a)
	}
	if err := p.ep.PutZcopy([]uct.IOV{{Buf: put}}, p.raddr+4096, p.rkey, nil); err != nil {
		t.Fatal(err)
	}
	back := make([]byte, 8192+2)
	if err := p.ep.GetZcopy([]uct.IOV{{Buf: back}}, p.raddr+4095, p.rkey, nil); err != nil {
		t.Fatal(err)
	}
	if back[0] != rmaPattern(4095) || string(back[1:8193]) != string(put) || back[8193] != rmaPattern(4096+8192) {
		t.Fatal("put then get mismatch")
	}
	small := []uct.IOV{{Buf: make([]byte, 16)}}
	for _, c := range []struct {
		name  string
		raddr uint64
		iov   []uct.IOV
		rkey  []byte
	}{
		{"below", p.raddr - 1, small, p.rkey},
		{"past end", p.raddr + rmaLen - 15, small, p.rkey},
		{"far", p.raddr + 1<<40, small, p.rkey},
		{"wrap", ^uint64(0) - 4, small, p.rkey},
		{"short rkey", p.raddr, small, p.rkey[:10]},
		{"other pid", p.raddr, small, func() []byte {
			k := append([]byte(nil), p.rkey...)
			binary.LittleEndian.PutUint32(k, uint32(os.Getpid()))
			return k
		}()},
	} {
		if err := p.ep.GetZcopy(c.iov, c.raddr, c.rkey, nil); !errors.Is(err, uct.ErrOutOfRange) {
			t.Errorf("get %s: %v, want ErrOutOfRange", c.name, err)
		}
		if err := p.ep.PutZcopy(c.iov, c.raddr, c.rkey, nil); !errors.Is(err, uct.ErrOutOfRange) {
			t.Errorf("put %s: %v, want ErrOutOfRange", c.name, err)
		}
	}
	// Read-only registration refuses a put.
	ro := append([]byte(nil), p.rkey...)
	binary.LittleEndian.PutUint32(ro[4:], uint32(uct.AccessRemoteRead))
	if err := p.ep.PutZcopy(small, p.raddr, ro, nil); !errors.Is(err, uct.ErrOutOfRange) {
		t.Errorf("put with read-only rkey: %v", err)
	}
}

// A peer SIGKILLed while flooding us: our sends to it turn into
// ErrEndpointReset (reported to the ErrHandler once), Close does not hang,
// and nothing is left in /dev/shm.
func TestTwoProcessPeerKilled(t *testing.T) {
	before := devShm()
	var resets atomic.Int32
	s := openSide(t, nil, uct.IfaceParams{ErrHandler: func(ep uct.EP, err error) {
		if errors.Is(err, uct.ErrEndpointReset) {
			resets.Add(1)
		}
	}})
	p := startPeer(t, s)
	var flood atomic.Int64
	s.iface.SetAMHandler(amFlood, func([]byte) { flood.Add(1) })
	fmt.Fprintln(p.in, "flood")
	waitFor(t, "flood", func() bool { return flood.Load() > 1000 })
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	p.cmd.Wait()
	p.exited = true
	var err error
	for i := 0; i < 10000; i++ {
		if err = p.ep.AMShort(amEcho, 0, nil); err != nil {
			break
		}
	}
	if !errors.Is(err, uct.ErrEndpointReset) {
		t.Errorf("send to a dead peer: %v, want ErrEndpointReset", err)
	}
	waitFor(t, "error handler", func() bool { return resets.Load() == 1 })
	done := make(chan struct{})
	go func() {
		p.ep.Close()
		s.close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close hangs after the peer died")
	}
	if after := devShm(); after != before {
		t.Errorf("/dev/shm changed: %q -> %q", before, after)
	}
}
