package ib_test

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/gouct/gouct/uct"
	"github.com/gouct/gouct/uct/ib"
)

// end is one side of a pair test: its own worker, MD and iface, like a process.
type end struct {
	w     *uct.Worker
	md    uct.MD
	iface uct.Iface
	ep    uct.EP
	errs  chan error
}

// openEnd opens rc_verbs on device dev ("rxe1:1").
func openEnd(t testing.TB, dev string) *end {
	t.Helper()
	c, _ := uct.LookupComponent("ib")
	cfg := uct.DefaultConfig()
	md, err := c.OpenMD(strings.Split(dev, ":")[0], cfg)
	if err != nil {
		t.Fatalf("open md %s: %v", dev, err)
	}
	tls, err := md.TLResources()
	if err != nil {
		md.Close()
		t.Fatalf("%s: %v", dev, err)
	}
	var tl *uct.TLResource
	for i := range tls {
		if tls[i].Device == dev {
			tl = &tls[i]
		}
	}
	if tl == nil {
		md.Close()
		t.Fatalf("no rc_verbs on %s (have %v)", dev, tls)
	}
	e := &end{w: uct.NewWorker(cfg), md: md, errs: make(chan error, 8)}
	e.iface, err = md.OpenIface(e.w, *tl, uct.IfaceParams{Config: cfg, ErrHandler: func(_ uct.EP, err error) {
		select {
		case e.errs <- err:
		default:
		}
	}})
	if err != nil {
		e.w.Close()
		md.Close()
		t.Fatalf("open iface %s: %v", dev, err)
	}
	return e
}

func (e *end) close(t testing.TB) {
	if e.ep != nil {
		if err := e.ep.Close(); err != nil {
			t.Errorf("ep close: %v", err)
		}
	}
	if err := e.iface.Close(); err != nil {
		t.Errorf("iface close: %v", err)
	}
	e.w.Close()
	if err := e.md.Close(); err != nil {
		t.Errorf("md close: %v", err)
	}
}

// newPair connects an endpoint on devA to one on devB, both ways.
func newPair(t testing.TB) (a, b *end) {
	t.Helper()
	needRDMA(t)
	a, b = openEPs(t, devA(), devB())
	if !a.iface.IsReachable(b.iface.DeviceAddress(), b.iface.IfaceAddress()) {
		t.Fatalf("%s cannot reach %s", devA(), devB())
	}
	connectEPs(t, a, b)
	return a, b
}

// openEPs opens an end on each device, closed at cleanup, each with an
// endpoint not yet connected.
func openEPs(t testing.TB, devA, devB string) (a, b *end) {
	t.Helper()
	a, b = openEnd(t, devA), openEnd(t, devB)
	t.Cleanup(func() { a.close(t); b.close(t) })
	var err error
	if a.ep, err = a.iface.CreateEP(uct.EPParams{}); err != nil {
		t.Fatal(err)
	}
	if b.ep, err = b.iface.CreateEP(uct.EPParams{}); err != nil {
		t.Fatal(err)
	}
	return a, b
}

// connectEPs connects a's endpoint to b's and b's to a's.
func connectEPs(t testing.TB, a, b *end) {
	t.Helper()
	aa, _ := a.ep.Address()
	ba, _ := b.ep.Address()
	if err := a.ep.ConnectToEP(b.iface.DeviceAddress(), ba); err != nil {
		t.Fatal(err)
	}
	if err := b.ep.ConnectToEP(a.iface.DeviceAddress(), aa); err != nil {
		t.Fatal(err)
	}
}

// inbox collects AMs for a test.
type inbox struct{ ch chan []byte }

func newInbox(e *end, id uint8) *inbox {
	in := &inbox{ch: make(chan []byte, 4096)}
	e.iface.SetAMHandler(id, func(d []byte) { in.ch <- append([]byte(nil), d...) })
	return in
}

func (in *inbox) next(t testing.TB) []byte {
	t.Helper()
	select {
	case d := <-in.ch:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("no message in 10s")
		return nil
	}
}

func retry(f func() error) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := f()
		if !errors.Is(err, uct.ErrNoResource) || time.Now().After(deadline) {
			return err
		}
		runtime.Gosched()
	}
}

func wait(t testing.TB, err error, ch chan error) error {
	t.Helper()
	if !errors.Is(err, uct.ErrInProgress) {
		return err
	}
	select {
	case err := <-ch:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("completion did not fire in 10s")
		return nil
	}
}

func comp() (*uct.Completion, chan error) {
	ch := make(chan error, 1)
	return uct.NewCompletion(1, func(err error) { ch <- err }), ch
}

// exercise sends every AM kind both ways and does a put and a get.
func exercise(t *testing.T, a, b *end, tag string) {
	t.Helper()
	inA, inB := newInbox(a, 3), newInbox(b, 3)
	payload := []byte("hello over " + tag)
	if err := retry(func() error { return a.ep.AMShort(3, 42, payload) }); err != nil {
		t.Fatalf("AMShort: %v", err)
	}
	if got := inB.next(t); !bytes.Equal(got[8:], payload) || got[0] != 42 {
		t.Fatalf("AMShort got %q", got)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), a.iface.Attr().MaxBcopy/16)
	if _, err := b.ep.AMBcopy(3, func(buf []byte) int { return copy(buf, big) }); err != nil {
		t.Fatalf("AMBcopy: %v", err)
	}
	if got := inA.next(t); !bytes.Equal(got, big) {
		t.Fatalf("AMBcopy: got %d bytes, want %d", len(got), len(big))
	}
	// Zero copy from registered user memory, then RMA both ways.
	zb := bytes.Repeat([]byte{0x5a}, 4000)
	zh, err := a.md.Register(zb, uct.AccessLocalRead)
	if err != nil {
		t.Fatal(err)
	}
	defer a.md.Deregister(zh)
	c, ch := comp()
	if err := wait(t, a.ep.AMZcopy(3, []byte("hdr"), []uct.IOV{{Buf: zb, MemH: zh}}, c), ch); err != nil {
		t.Fatalf("AMZcopy: %v", err)
	}
	if got := inB.next(t); string(got[:3]) != "hdr" || !bytes.Equal(got[3:], zb) {
		t.Fatalf("AMZcopy: got %d bytes", len(got))
	}
	remote := make([]byte, 1<<20)
	rh, err := b.md.Register(remote, uct.AccessLocalWrite|uct.AccessRemoteWrite|uct.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	defer b.md.Deregister(rh)
	rkey, _ := b.md.PackRKey(rh)
	raddr := uint64(uintptr(unsafe.Pointer(&remote[0])))
	local := make([]byte, 1<<20)
	for i := range local {
		local[i] = byte(i * 7)
	}
	lh, err := a.md.Register(local, uct.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer a.md.Deregister(lh)
	c, ch = comp()
	if err := wait(t, a.ep.PutZcopy([]uct.IOV{{Buf: local, MemH: lh}}, raddr, rkey, c), ch); err != nil {
		t.Fatalf("PutZcopy: %v", err)
	}
	if !bytes.Equal(remote, local) {
		t.Fatal("PutZcopy: remote differs")
	}
	for i := range remote {
		remote[i] = byte(i * 13)
	}
	c, ch = comp()
	if err := wait(t, a.ep.GetZcopy([]uct.IOV{{Buf: local, MemH: lh}}, raddr, rkey, c), ch); err != nil {
		t.Fatalf("GetZcopy: %v", err)
	}
	if !bytes.Equal(remote, local) {
		t.Fatal("GetZcopy: local differs")
	}
}

// TestPair: every operation between IBTEST_DEV_A and IBTEST_DEV_B (the
// veth pair rxe1→rxe2 in scripts/vm-test.sh).
func TestPair(t *testing.T) {
	a, b := newPair(t)
	exercise(t, a, b, devA()+"->"+devB())
}

// TestForkWithLiveQPs: a process with connected QPs and registered memory
// runs os/exec children and its endpoints keep working (the seed's
// copy-on-write hazard).
func TestForkWithLiveQPs(t *testing.T) {
	a, b := newPair(t)
	exercise(t, a, b, "before fork")
	for i := 0; i < 5; i++ {
		out, err := exec.Command("sh", "-c", "echo child $$").Output()
		if err != nil || !strings.HasPrefix(string(out), "child") {
			t.Fatalf("child %d: %q %v", i, out, err)
		}
	}
	exercise(t, a, b, "after fork")
}

// TestEndpointFailure: an RDMA write with a wrong rkey puts the QP in the
// error state: the completion fails, ErrHandler runs, and later operations
// return ErrEndpointReset instead of hanging.
func TestEndpointFailure(t *testing.T) {
	a, b := newPair(t)
	local := make([]byte, 64)
	lh, err := a.md.Register(local, uct.AccessLocalRead)
	if err != nil {
		t.Fatal(err)
	}
	defer a.md.Deregister(lh)
	remote := make([]byte, 64)
	rh, err := b.md.Register(remote, uct.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer b.md.Deregister(rh)
	rkey, _ := b.md.PackRKey(rh)
	rkey[0] ^= 0x5a
	c, ch := comp()
	err = wait(t, a.ep.PutZcopy([]uct.IOV{{Buf: local, MemH: lh}}, uint64(uintptr(unsafe.Pointer(&remote[0]))), rkey, c), ch)
	if !errors.Is(err, uct.ErrEndpointReset) {
		t.Fatalf("put with a bad rkey: %v, want ErrEndpointReset", err)
	}
	select {
	case err := <-a.errs:
		if !errors.Is(err, uct.ErrEndpointReset) {
			t.Errorf("ErrHandler got %v", err)
		}
		t.Logf("ErrHandler: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("ErrHandler not called")
	}
	if err := a.ep.AMShort(1, 0, nil); !errors.Is(err, uct.ErrEndpointReset) {
		t.Errorf("AMShort on a failed endpoint: %v", err)
	}
	if err := a.ep.Flush(nil); !errors.Is(err, uct.ErrEndpointReset) {
		t.Errorf("Flush on a failed endpoint: %v", err)
	}
}

// TestPendingBeforeConnect: requests queued on an unconnected endpoint run
// once it connects.
func TestPendingBeforeConnect(t *testing.T) {
	needRDMA(t)
	a, b := openEnd(t, devA()), openEnd(t, devB())
	defer func() { a.close(t); b.close(t) }()
	var err error
	a.ep, _ = a.iface.CreateEP(uct.EPParams{})
	b.ep, _ = b.iface.CreateEP(uct.EPParams{})
	if err = a.ep.AMShort(2, 1, nil); !errors.Is(err, uct.ErrNoResource) {
		t.Fatalf("AMShort before connect: %v, want ErrNoResource", err)
	}
	in := newInbox(b, 2)
	var ran atomic.Bool
	if err := a.ep.PendingAdd(&uct.PendingReq{Func: func() error {
		ran.Store(true)
		return a.ep.AMShort(2, 7, []byte("queued"))
	}}); err != nil {
		t.Fatalf("PendingAdd before connect: %v", err)
	}
	aa, _ := a.ep.Address()
	ba, _ := b.ep.Address()
	if err := b.ep.ConnectToEP(a.iface.DeviceAddress(), aa); err != nil {
		t.Fatal(err)
	}
	if err := a.ep.ConnectToEP(b.iface.DeviceAddress(), ba); err != nil {
		t.Fatal(err)
	}
	if got := in.next(t); string(got[8:]) != "queued" || !ran.Load() {
		t.Fatalf("got %q", got)
	}
	if err := a.ep.ConnectToEP(b.iface.DeviceAddress(), ba); err == nil {
		t.Error("second ConnectToEP: no error")
	}
	if err := a.ep.ConnectToEP(nil, []byte("short")); err == nil {
		t.Error("ConnectToEP with a garbage address: no error")
	}
}

// TestAttributes: what the port query reports is sane.
func TestAttributes(t *testing.T) {
	a, _ := newPair(t)
	at := a.iface.Attr()
	t.Logf("%s: %+v", devA(), at)
	if at.Bandwidth.Dedicated <= 0 || at.Latency.C <= 0 {
		t.Errorf("bandwidth %v latency %v", at.Bandwidth, at.Latency)
	}
	if at.MaxShort < 8 || at.MaxBcopy < 1024 || at.MaxIOV < 1 || at.MaxPut < 1<<20 {
		t.Errorf("limits: %+v", at)
	}
	if !at.Cap.Has(uct.CapAMShort | uct.CapAMBcopy | uct.CapAMZcopy | uct.CapPutZcopy | uct.CapGetZcopy | uct.CapConnectToEP | uct.CapEvent) {
		t.Errorf("caps %v", at.Cap)
	}
	if r := a.iface.Resource(); r.TL != "rc_verbs" || r.Type != uct.DeviceNet || r.Device != devA() {
		t.Errorf("resource %+v", r)
	}
	if got := fmt.Sprint(a.md.Attr().RKeySize); got != "4" {
		t.Errorf("rkey size %s", got)
	}
}

// TestMD: RDMANET_NET_DEVICES filters ports; MemAlloc memory is registered
// and usable as an RMA target; registrations are counted so a leak makes
// Close fail.
func TestMD(t *testing.T) {
	needRDMA(t)
	c, _ := uct.LookupComponent("ib")
	dev := strings.Split(devA(), ":")[0]
	cfg := uct.DefaultConfig()
	cfg.NetDevices = []string{"nosuchdev0"}
	md, err := c.OpenMD(dev, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if tls, err := md.TLResources(); err == nil {
		t.Errorf("RDMANET_NET_DEVICES=nosuchdev0: resources %v", tls)
	}
	md.Close()
	cfg.NetDevices = []string{"^" + devA()}
	md, _ = c.OpenMD(dev, cfg)
	if tls, err := md.TLResources(); err == nil {
		t.Errorf("RDMANET_NET_DEVICES=^%s: resources %v", devA(), tls)
	}
	md.Close()
	cfg.NetDevices = []string{devA()}
	md, _ = c.OpenMD(dev, cfg)
	if tls, err := md.TLResources(); err != nil || len(tls) != 1 || tls[0].Device != devA() {
		t.Errorf("RDMANET_NET_DEVICES=%s: %v %v", devA(), tls, err)
	}
	mem, err := md.MemAlloc(1 << 20)
	if err != nil || len(mem.Buf) != 1<<20 {
		t.Fatalf("MemAlloc: %v", err)
	}
	mem.Buf[0], mem.Buf[len(mem.Buf)-1] = 1, 2
	if rk, err := md.PackRKey(mem.MemH); err != nil || len(rk) != 4 {
		t.Errorf("PackRKey: %x %v", rk, err)
	}
	h, err := md.Register(make([]byte, 100), uct.AccessLocalRead)
	if err != nil {
		t.Fatal(err)
	}
	if err := md.Close(); err == nil {
		t.Error("md.Close with live registrations: no error")
	}
	if err := md.MemFree(mem); err != nil {
		t.Error(err)
	}
	if err := md.Deregister(h); err != nil {
		t.Error(err)
	}
	if err := md.Deregister("junk"); err == nil {
		t.Error("Deregister(junk): no error")
	}
	if err := md.Close(); err != nil {
		t.Errorf("md.Close after deregistering: %v", err)
	}
}

// TestResourceForIP: the device whose RoCE v2 GID is the IP (rxe0 has
// 10.77.0.1 in the VM; rxe1 10.78.0.1, rxe2 10.78.0.2 with --veth).
func TestResourceForIP(t *testing.T) {
	needRDMA(t)
	for ip, want := range map[string]string{"10.77.0.1": "rxe0:1", "10.78.0.1": "rxe1:1", "10.78.0.2": "rxe2:1"} {
		dev, idx, err := ib.ResourceForIP(net.ParseIP(ip))
		if want != "rxe0:1" && err != nil && !strings.Contains(devB(), "rxe2") {
			continue // no veth pair in this run
		}
		if err != nil || dev != want || idx < 0 {
			t.Errorf("ResourceForIP(%s) = %s, %d, %v; want %s", ip, dev, idx, err, want)
		}
	}
	if _, _, err := ib.ResourceForIP(net.ParseIP("192.0.2.1")); !errors.Is(err, uct.ErrUnavailable) {
		t.Errorf("ResourceForIP(192.0.2.1): %v", err)
	}
}

// TestHotPathAllocs: a message costs no allocation anywhere in the process
// (sender, both workers, event goroutines) for AMShort, AMBcopy and AMZcopy
// ping-pongs.
func TestHotPathAllocs(t *testing.T) {
	a, b := newPair(t)
	var got atomic.Int64
	b.iface.SetAMHandler(7, func(d []byte) { b.ep.AMShort(7, 0, nil) })
	a.iface.SetAMHandler(7, func([]byte) { got.Add(1) })
	zb := make([]byte, 2048)
	zh, err := a.md.Register(zb, uct.AccessLocalRead)
	if err != nil {
		t.Fatal(err)
	}
	defer a.md.Deregister(zh)
	iov := []uct.IOV{{Buf: zb, MemH: zh}}
	zc := uct.NewCompletion(1<<30, nil)
	pack := func(buf []byte) int { return copy(buf, zb[:1500]) }
	payload := make([]byte, 64)
	sends := map[string]func() error{
		"AMShort": func() error { return a.ep.AMShort(7, 1, payload) },
		"AMBcopy": func() error { _, err := a.ep.AMBcopy(7, pack); return err },
		"AMZcopy": func() error {
			if err := a.ep.AMZcopy(7, payload[:8], iov, zc); !errors.Is(err, uct.ErrInProgress) {
				return err
			}
			return nil
		},
	}
	for name, send := range sends {
		var failed error
		round := func() {
			want := got.Load() + 1
			for {
				err := send()
				if err == nil {
					break
				}
				if !errors.Is(err, uct.ErrNoResource) {
					failed = err
					return
				}
				a.w.TryProgress()
				runtime.Gosched()
			}
			for got.Load() < want {
				a.w.TryProgress()
				runtime.Gosched()
			}
		}
		for range 50 {
			round()
		}
		allocs := testing.AllocsPerRun(300, round)
		if failed != nil {
			t.Fatalf("%s: %v", name, failed)
		}
		t.Logf("%s ping-pong: %.3f allocations per round trip", name, allocs)
		if allocs > 0.1 {
			t.Errorf("%s ping-pong: %.2f allocations per round trip, want 0", name, allocs)
		}
	}
}

// TestGIDIndex: RDMANET_IB_GID_INDEX picks the GID; an index the port does
// not have leaves the device without resources, saying why.
func TestGIDIndex(t *testing.T) {
	needRDMA(t)
	c, _ := uct.LookupComponent("ib")
	dev := strings.Split(devA(), ":")[0]
	cfg := uct.DefaultConfig()
	cfg.IBGIDIndex = 999
	md, err := c.OpenMD(dev, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := md.TLResources(); err == nil || !strings.Contains(err.Error(), "GID index 999") {
		t.Errorf("RDMANET_IB_GID_INDEX=999: %v", err)
	}
	md.Close()
	// Index 1 is rxe's IPv4-mapped RoCE v2 GID: the device address carries it.
	cfg.IBGIDIndex = 1
	md, err = c.OpenMD(dev, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer md.Close()
	tls, err := md.TLResources()
	if err != nil {
		t.Fatal(err)
	}
	w := uct.NewWorker(cfg)
	defer w.Close()
	ifc, err := md.OpenIface(w, tls[0], uct.IfaceParams{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	defer ifc.Close()
	da := ifc.DeviceAddress()
	if ip := net.IP(da[3:19]); ip.To4() == nil {
		t.Errorf("GID index 1: device address GID %v, want an IPv4-mapped one", ip)
	}
}
