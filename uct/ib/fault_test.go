//go:build linux && cgo && !noverbs

package ib_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/gouct/gouct/uct"
	"github.com/gouct/gouct/uct/ib"
)

// waitErr waits up to d for the ErrHandler of e and returns its error and
// how long it took.
func waitErr(t *testing.T, e *end, d time.Duration) (error, time.Duration) {
	t.Helper()
	start := time.Now()
	select {
	case err := <-e.errs:
		return err, time.Since(start)
	case <-time.After(d):
		t.Fatalf("ErrHandler not called in %v", d)
		return nil, 0
	}
}

// TestForcedQPError: a connected QP moved to the error state
// (TestingForceQPError: ibv_modify_qp, then the QP-fatal async event) fails
// its endpoint without any operation posted: the ErrHandler hears of it,
// later operations fail; the peer endpoint fails at its next send (no
// ACK: transport retries exceeded).
func TestForcedQPError(t *testing.T) {
	a, b := newPair(t)
	qpn := ib.EPQP(a.ep)
	if !slices.Contains(ib.TestingEndpointQPs(), qpn) {
		t.Fatalf("QP %v not among the connected endpoints %v", qpn, ib.TestingEndpointQPs())
	}
	if err := ib.TestingForceQPError(qpn); err != nil {
		t.Fatal(err)
	}
	err, took := waitErr(t, a, 5*time.Second)
	if !errors.Is(err, uct.ErrEndpointReset) {
		t.Errorf("ErrHandler got %v, want ErrEndpointReset", err)
	}
	t.Logf("endpoint failed %v after the fault: %v", took, err)
	if err := a.ep.AMShort(1, 0, nil); !errors.Is(err, uct.ErrEndpointReset) {
		t.Errorf("AMShort on the failed endpoint: %v", err)
	}
	if slices.Contains(ib.TestingEndpointQPs(), qpn) {
		t.Errorf("QP %v still listed as connected", qpn)
	}
	if err := ib.TestingForceQPError(qpn); !errors.Is(err, uct.ErrInvalidParam) {
		t.Errorf("forcing a failed endpoint: %v, want ErrInvalidParam", err)
	}
	// The peer notices at its next send.
	if err := retry(func() error { return b.ep.AMShort(1, 0, nil) }); err != nil {
		t.Fatalf("peer send: %v", err)
	}
	err, took = waitErr(t, b, 30*time.Second)
	if !errors.Is(err, uct.ErrEndpointReset) {
		t.Errorf("peer ErrHandler got %v, want ErrEndpointReset", err)
	}
	t.Logf("peer failed %v after its send: %v", took, err)
}

// TestDeviceGone: what a removed device triggers (KillMD) fails every
// endpoint at once with the cause (ErrHandler, completions in flight),
// releases every verbs resource and registration, refuses new endpoints
// and registrations, and reports the iface failed; closing afterwards
// works. The peer's MD is untouched.
func TestDeviceGone(t *testing.T) {
	a, b := newPair(t)
	base := ib.Registrations()
	local := make([]byte, 1<<20)
	lh, err := a.md.Register(local, uct.AccessLocalRead)
	if err != nil {
		t.Fatal(err)
	}
	remote := make([]byte, 1<<20)
	rh, err := b.md.Register(remote, uct.AccessRemoteWrite|uct.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer b.md.Deregister(rh)
	if got := ib.Registrations(); got.Live != base.Live+2 || got.Total != base.Total+2 {
		t.Errorf("registrations %+v after 2, baseline %+v", got, base)
	}
	rkey, _ := b.md.PackRKey(rh)
	raddr := uint64(uintptr(unsafe.Pointer(&remote[0])))
	// Operations in flight when the device goes: they complete with the
	// cause or with success (if they finished first), never hang.
	var chs []chan error
	for range 8 {
		c, ch := comp()
		err := a.ep.PutZcopy([]uct.IOV{{Buf: local, MemH: lh}}, raddr, rkey, c)
		if errors.Is(err, uct.ErrNoResource) {
			break
		}
		if !errors.Is(err, uct.ErrInProgress) {
			t.Fatalf("put: %v", err)
		}
		chs = append(chs, ch)
	}
	cause := fmt.Errorf("test: device removed: %w", uct.ErrEndpointReset)
	start := time.Now()
	ib.KillMD(a.md, cause)
	t.Logf("released in %v with %d puts in flight", time.Since(start), len(chs))
	if err, _ := waitErr(t, a, 5*time.Second); !errors.Is(err, cause) {
		t.Errorf("ErrHandler got %v, want the cause", err)
	}
	for k, ch := range chs {
		select {
		case err := <-ch:
			if err != nil && !errors.Is(err, cause) {
				t.Errorf("put %d completed with %v", k, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("put %d never completed", k)
		}
	}
	if err := a.ep.AMShort(1, 0, nil); !errors.Is(err, cause) {
		t.Errorf("AMShort after: %v", err)
	}
	if _, err := a.iface.CreateEP(uct.EPParams{}); !errors.Is(err, cause) {
		t.Errorf("CreateEP after: %v", err)
	}
	if _, err := a.md.Register(make([]byte, 64), uct.AccessLocalRead); err == nil {
		t.Error("Register after: no error")
	}
	if f, ok := a.iface.(interface{ Failed() error }); !ok || !errors.Is(f.Failed(), cause) {
		t.Errorf("iface Failed: %v", ok)
	}
	if got := ib.Registrations(); got.Live != base.Live+1 { // b's
		t.Errorf("live registrations %d after the device went, want %d", got.Live, base.Live+1)
	}
	if err := a.md.Deregister(lh); err != nil {
		t.Errorf("Deregister after: %v", err)
	}
	a.iface.Progress()
	if !a.iface.Arm() {
		t.Error("Arm after: false")
	}
	// The peer still works with another endpoint.
	if _, err := b.iface.CreateEP(uct.EPParams{}); err != nil {
		t.Errorf("peer CreateEP: %v", err)
	}
}

// TestDeviceCheckAllocs: the periodic device check allocates nothing: it
// runs 5 times a second per iface, also while an application counts its
// allocations per message (the stream's TestAllocs over rc_verbs).
func TestDeviceCheckAllocs(t *testing.T) {
	a, _ := newPair(t)
	if n := testing.AllocsPerRun(200, func() { ib.CheckMD(a.md) }); n != 0 {
		t.Errorf("device check: %.1f allocations per run, want 0", n)
	}
	if err := a.md.(interface{ Failed() error }).Failed(); err != nil {
		t.Errorf("device reported failed after checks: %v", err)
	}
}
