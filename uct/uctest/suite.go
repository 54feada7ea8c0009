package uctest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"go.uber.org/goleak"

	"github.com/gouct/gouct/uct"
)

const amID = 7 // the AM id the suite uses (any valid id)

func runtimeGosched() { runtime.Gosched() }

// Run runs the whole suite on the first resource of transport tl.
func Run(t *testing.T, tl string) { RunOptions(t, Options{TL: tl}) }

// RunOptions runs the whole suite on the resource o selects.
func RunOptions(t *testing.T, o Options) {
	if _, err := Resources(o); err != nil {
		if o.SkipIfAbsent {
			t.Skipf("uctest: %v", err)
		}
		t.Fatalf("uctest: %v", err)
	}
	leaks := goleak.IgnoreCurrent()
	tests := []struct {
		name string
		fn   func(*testing.T, Options)
	}{
		{"AMShort", testAMShort},
		{"AMBcopy", testAMBcopy},
		{"AMZcopy", testAMZcopy},
		{"Integrity", testIntegrity},
		{"Ordering", testOrdering},
		{"Pending", testPending},
		{"Flush", testFlush},
		{"CloseInFlight", testCloseInFlight},
		{"RMA", testRMA},
		{"RMABounds", testRMABounds},
		{"Concurrent", testConcurrent},
		{"Reachable", testReachable},
		{"Idle", testIdle},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, o) })
	}
	t.Run("Leaks", func(t *testing.T) {
		if err := goleak.Find(leaks); err != nil {
			t.Errorf("goroutines left after every pair was closed: %v", err)
		}
	})
}

func needCap(t *testing.T, p *pair, c uct.Capability) {
	t.Helper()
	if !p.a.attr.Cap.Has(c) {
		t.Skipf("%s lacks %v", p.o.TL, c)
	}
}

func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n+7)
	for i := 0; i < n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b[:n:n]
}

func testAMShort(t *testing.T, o Options) {
	p := newPair(t, o)
	needCap(t, p, uct.CapAMShort)
	rec := newRecorder()
	if err := p.b.iface.SetAMHandler(amID, rec.handle); err != nil {
		t.Fatal(err)
	}
	max := p.a.attr.MaxShort
	r := rand.New(rand.NewPCG(1, 2))
	sizes := []int{0, 1, max}
	var want [][]byte
	for i, n := range sizes {
		pl := randBytes(r, n)
		hdr := uint64(0x0102030405060708) + uint64(i)
		if err := retry(func() error { return p.a.ep.AMShort(amID, hdr, pl) }); err != nil {
			t.Fatalf("AMShort %d bytes: %v", n, err)
		}
		want = append(want, binary.LittleEndian.AppendUint64(nil, hdr), pl)
	}
	got := rec.wait(t, len(sizes), 10*time.Second)
	for i := range sizes {
		w := append(want[2*i], want[2*i+1]...)
		if !bytes.Equal(got[i], w) {
			t.Errorf("AMShort #%d (%d bytes): got %d bytes %x..., want %d bytes", i, sizes[i], len(got[i]), head(got[i]), len(w))
		}
	}
	err := p.a.ep.AMShort(amID, 1, make([]byte, max+1))
	if err == nil || errors.Is(err, uct.ErrNoResource) || errors.Is(err, uct.ErrInProgress) {
		t.Errorf("AMShort of MaxShort+1 = %d bytes: err %v, want an error", max+1, err)
	}
	if err := p.a.ep.AMShort(uct.MaxAMID, 1, nil); err == nil {
		t.Errorf("AMShort with id %d: no error", uct.MaxAMID)
	}
	rec.quiet(t, len(sizes), 50*time.Millisecond)
}

func head(b []byte) []byte {
	if len(b) > 16 {
		return b[:16]
	}
	return b
}

func bcopy(ep uct.EP, data []byte) error {
	n, err := ep.AMBcopy(amID, func(b []byte) int { return copy(b, data) })
	if err == nil && n != len(data) {
		return fmt.Errorf("AMBcopy returned length %d, packed %d", n, len(data))
	}
	return err
}

func testAMBcopy(t *testing.T, o Options) {
	p := newPair(t, o)
	needCap(t, p, uct.CapAMBcopy)
	rec := newRecorder()
	p.b.iface.SetAMHandler(amID, rec.handle)
	max := p.a.attr.MaxBcopy
	sizes := []int{0, 1, max}
	if s := p.a.attr.MaxShort + 1; s > 1 && s < max {
		sizes = append(sizes, s)
	}
	r := rand.New(rand.NewPCG(3, 4))
	var want [][]byte
	for _, n := range sizes {
		d := randBytes(r, n)
		if err := retry(func() error { return bcopy(p.a.ep, d) }); err != nil {
			t.Fatalf("AMBcopy %d bytes: %v", n, err)
		}
		want = append(want, d)
	}
	got := rec.wait(t, len(sizes), 10*time.Second)
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Errorf("AMBcopy #%d (%d bytes): got %d bytes", i, len(want[i]), len(got[i]))
		}
	}
	// A pack function that claims more than the buffer is refused, not delivered.
	for _, bad := range []int{max + 1, 1 << 30, -1} {
		_, err := p.a.ep.AMBcopy(amID, func(b []byte) int {
			if len(b) < max {
				t.Errorf("AMBcopy buffer of %d bytes, MaxBcopy %d", len(b), max)
			}
			return bad
		})
		if err == nil || errors.Is(err, uct.ErrNoResource) {
			t.Errorf("AMBcopy whose pack returns %d: err %v, want an error", bad, err)
		}
	}
	rec.quiet(t, len(sizes), 50*time.Millisecond)
	// The EP still works after the refusals.
	if err := retry(func() error { return bcopy(p.a.ep, []byte("after")) }); err != nil {
		t.Fatalf("AMBcopy after refused pack: %v", err)
	}
	got = rec.wait(t, len(sizes)+1, 10*time.Second)
	if string(got[len(sizes)]) != "after" {
		t.Errorf("message after refused pack: %q", got[len(sizes)])
	}
}

// register registers each buffer of iov on md when it can register.
func register(tb testing.TB, md uct.MD, iov []uct.IOV, access uct.Access) func() {
	tb.Helper()
	if md.Attr().Flags&uct.MDCanRegister == 0 {
		return func() {}
	}
	var pin runtime.Pinner
	for i := range iov {
		if len(iov[i].Buf) == 0 {
			continue // an empty IOV carries no MemH
		}
		pin.Pin(&iov[i].Buf[0])
		h, err := md.Register(iov[i].Buf, access)
		if err != nil {
			tb.Fatalf("register %d bytes: %v", len(iov[i].Buf), err)
		}
		iov[i].MemH = h
	}
	return func() {
		for _, v := range iov {
			if v.MemH == nil {
				continue
			}
			if err := md.Deregister(v.MemH); err != nil {
				tb.Errorf("deregister: %v", err)
			}
		}
		pin.Unpin()
	}
}

// split cuts b into n IOVs of uneven sizes (some empty when b is short).
func split(b []byte, n int) []uct.IOV {
	n = max(n, 1)
	iov := make([]uct.IOV, 0, n)
	for i := 0; i < n-1; i++ {
		k := len(b) / (n - i)
		if i%2 == 0 && k > 1 {
			k /= 2
		}
		iov = append(iov, uct.IOV{Buf: b[:k:k]})
		b = b[k:]
	}
	return append(iov, uct.IOV{Buf: b})
}

func zcopy(tb testing.TB, s *side, hdr, data []byte, niov int) error {
	tb.Helper()
	iov := split(data, niov)
	done := register(tb, s.md, iov, uct.AccessLocalRead)
	defer done()
	cp := newCompletion()
	err := retry(func() error { return s.ep.AMZcopy(amID, hdr, iov, cp.c) })
	return cp.result(tb, err, "AMZcopy")
}

func testAMZcopy(t *testing.T, o Options) {
	p := newPair(t, o)
	needCap(t, p, uct.CapAMZcopy)
	rec := newRecorder()
	p.b.iface.SetAMHandler(amID, rec.handle)
	a := p.a.attr
	r := rand.New(rand.NewPCG(5, 6))
	hmax := min(a.MaxHeader, 64)
	zmax := min(a.MaxZcopy, 4<<20) // transports with huge limits are tested up to 4 MiB
	cases := []struct{ hdr, size, niov int }{
		{0, 0, 1}, {0, 1, 1}, {hmax, 0, 1}, {hmax, 1, 1},
		{min(8, hmax), zmax / 2, a.MaxIOV},
		{0, zmax, 1},
		{hmax, zmax - hmax, a.MaxIOV},
		{min(8, hmax), zmax - min(8, hmax), 2},
	}
	var want [][]byte
	for _, c := range cases {
		if c.size < 0 {
			continue
		}
		hdr, data := randBytes(r, c.hdr), randBytes(r, c.size)
		if err := zcopy(t, p.a, hdr, data, min(c.niov, max(a.MaxIOV, 1))); err != nil {
			t.Fatalf("AMZcopy header %d + %d bytes in %d iovs: %v", c.hdr, c.size, c.niov, err)
		}
		want = append(want, append(hdr, data...))
	}
	got := rec.wait(t, len(want), 10*time.Second)
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Errorf("AMZcopy #%d (%d bytes): got %d bytes", i, len(want[i]), len(got[i]))
		}
	}
	if a.MaxZcopy < 16<<20 {
		if err := zcopy(t, p.a, nil, make([]byte, a.MaxZcopy+1), 1); err == nil {
			t.Errorf("AMZcopy of MaxZcopy+1 = %d bytes: no error", a.MaxZcopy+1)
		}
	}
	if a.MaxIOV < 64 {
		if err := zcopy(t, p.a, nil, make([]byte, a.MaxIOV+1), a.MaxIOV+1); err == nil {
			t.Errorf("AMZcopy with MaxIOV+1 = %d iovs: no error", a.MaxIOV+1)
		}
	}
	rec.quiet(t, len(want), 50*time.Millisecond)
}

// message kinds for the integrity stream.
const (
	kindShort = iota
	kindBcopy
	kindZcopy
)

// sendKind sends data with the AM kind k; AMShort carries data[:8] as the header.
func sendKind(tb testing.TB, s *side, k int, data []byte) error {
	switch k {
	case kindShort:
		hdr := binary.LittleEndian.Uint64(data)
		return retry(func() error { return s.ep.AMShort(amID, hdr, data[8:]) })
	case kindBcopy:
		return retry(func() error { return bcopy(s.ep, data) })
	default:
		h := min(8, s.attr.MaxHeader)
		return zcopy(tb, s, data[:h], data[h:], s.attr.MaxIOV)
	}
}

func testIntegrity(t *testing.T, o Options) {
	p := newPair(t, o)
	a := p.a.attr
	var kinds []int
	if a.Cap.Has(uct.CapAMShort) {
		kinds = append(kinds, kindShort)
	}
	if a.Cap.Has(uct.CapAMBcopy) {
		kinds = append(kinds, kindBcopy)
	}
	if a.Cap.Has(uct.CapAMZcopy) {
		kinds = append(kinds, kindZcopy)
	}
	if len(kinds) == 0 {
		t.Skip("no AM capability")
	}
	rec := newRecorder()
	p.b.iface.SetAMHandler(amID, rec.handle)
	r := rand.New(rand.NewPCG(7, 8))
	const n = 400
	for i := 0; i < n; i++ {
		k := kinds[r.IntN(len(kinds))]
		limit := map[int]int{kindShort: a.MaxShort + 8, kindBcopy: a.MaxBcopy, kindZcopy: min(a.MaxZcopy, 256<<10)}[k]
		size := 12 + r.IntN(max(limit-12, 0)+1)
		if r.IntN(4) == 0 {
			size = limit
		}
		size = max(min(size, limit), 12)
		// [seq u32][crc32 of the rest u32][kind u32][random...]
		d := randBytes(r, size)
		binary.LittleEndian.PutUint32(d[0:], uint32(i))
		binary.LittleEndian.PutUint32(d[8:], uint32(k))
		binary.LittleEndian.PutUint32(d[4:], crc32.ChecksumIEEE(d[8:]))
		if err := sendKind(t, p.a, k, d); err != nil {
			t.Fatalf("message %d (kind %d, %d bytes): %v", i, k, size, err)
		}
	}
	got := rec.wait(t, n, 20*time.Second)
	for i, m := range got {
		if len(m) < 12 {
			t.Fatalf("message %d: %d bytes", i, len(m))
		}
		if seq := binary.LittleEndian.Uint32(m); seq != uint32(i) {
			t.Fatalf("message %d carries seq %d", i, seq)
		}
		if c := crc32.ChecksumIEEE(m[8:]); c != binary.LittleEndian.Uint32(m[4:]) {
			t.Fatalf("message %d (kind %d, %d bytes): checksum mismatch", i, binary.LittleEndian.Uint32(m[8:]), len(m))
		}
	}
}

// amSeq sends a small message carrying seq with the cheapest AM kind.
func amSeq(s *side, seq uint64) error {
	if s.attr.Cap.Has(uct.CapAMShort) {
		return s.ep.AMShort(amID, seq, nil)
	}
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], seq)
	return bcopy(s.ep, b[:])
}

func checkSeq(tb testing.TB, got [][]byte, from int) {
	tb.Helper()
	for i, m := range got {
		if len(m) < 8 {
			tb.Fatalf("message %d: %d bytes", i, len(m))
		}
		if s := binary.LittleEndian.Uint64(m); s != uint64(from+i) {
			tb.Fatalf("message %d carries seq %d, want %d (lost, duplicated or reordered)", i, s, from+i)
		}
	}
}

func testOrdering(t *testing.T, o Options) {
	p := newPair(t, o)
	rec := newRecorder()
	p.b.iface.SetAMHandler(amID, rec.handle)
	const n = 5000
	for i := 0; i < n; i++ {
		if err := retry(func() error { return amSeq(p.a, uint64(i)) }); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	checkSeq(t, rec.wait(t, n, 20*time.Second), 0)
	rec.quiet(t, n, 20*time.Millisecond)
}

// fill sends bcopy messages of seq numbers from *next until ErrNoResource
// (true) or limit messages (false).
func fill(t *testing.T, s *side, next *atomic.Int64, size int, limit int64, deadline time.Time) bool {
	buf := make([]byte, size)
	for next.Load() < limit && time.Now().Before(deadline) {
		binary.LittleEndian.PutUint64(buf, uint64(next.Load()))
		err := bcopy(s.ep, buf)
		if errors.Is(err, uct.ErrNoResource) {
			return true
		}
		if err != nil {
			t.Fatalf("send %d: %v", next.Load(), err)
		}
		next.Add(1)
	}
	return false
}

func testPending(t *testing.T, o Options) {
	p := newPair(t, o)
	needCap(t, p, uct.CapAMBcopy)
	p.warmup()
	rec := newRecorder()
	rec.gate = make(chan struct{})
	p.b.iface.SetAMHandler(amID, rec.handle)
	size := p.a.attr.MaxBcopy
	// Bounded buffering: with the receiving worker stalled in its handler,
	// the sender must run out of resources well before 256 MiB.
	limit := int64(256<<20) / int64(size)
	var next atomic.Int64
	if !fill(t, p.a, &next, size, limit, time.Now().Add(20*time.Second)) {
		close(rec.gate)
		t.Fatalf("no ErrNoResource after %d messages of %d bytes with the receiver stalled: unbounded buffering", next.Load(), size)
	}
	t.Logf("ErrNoResource after %d messages of %d bytes with the receiver stalled", next.Load(), size)
	total := next.Load() + 300
	done := make(chan struct{})
	var fails atomic.Value
	buf := make([]byte, size)
	req := &uct.PendingReq{}
	req.Func = func() error {
		for next.Load() < total {
			binary.LittleEndian.PutUint64(buf, uint64(next.Load()))
			err := bcopy(p.a.ep, buf)
			if errors.Is(err, uct.ErrNoResource) {
				return err
			}
			if err != nil {
				fails.Store(err)
				close(done)
				return nil
			}
			next.Add(1)
		}
		close(done)
		return nil
	}
	for {
		err := p.a.ep.PendingAdd(req)
		if err == nil {
			break
		}
		if !errors.Is(err, uct.ErrBusy) {
			close(rec.gate)
			t.Fatalf("PendingAdd: %v", err)
		}
		// Room again: send more ourselves, then queue.
		fill(t, p.a, &next, size, total, time.Now().Add(time.Second))
		if next.Load() >= total {
			close(done)
			break
		}
	}
	close(rec.gate)
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("pending request still queued 20s after the receiver resumed (%d of %d sent)", next.Load(), total)
	}
	if e := fails.Load(); e != nil {
		t.Fatalf("send from pending callback: %v", e)
	}
	got := rec.wait(t, int(total), 30*time.Second)
	checkSeq(t, got, 0)
	rec.quiet(t, int(total), 20*time.Millisecond)
}

func testFlush(t *testing.T, o Options) {
	p := newPair(t, o)
	rec := newRecorder()
	p.b.iface.SetAMHandler(amID, rec.handle)
	cp := newCompletion()
	if err := cp.result(t, p.a.ep.Flush(cp.c), "Flush of an idle EP"); err != nil {
		t.Fatalf("Flush of an idle EP: %v", err)
	}
	for i := 0; i < 100; i++ {
		if err := retry(func() error { return amSeq(p.a, uint64(i)) }); err != nil {
			t.Fatal(err)
		}
	}
	cp = newCompletion()
	if err := cp.result(t, retry(func() error { return p.a.ep.Flush(cp.c) }), "Flush"); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	checkSeq(t, rec.wait(t, 100, 10*time.Second), 0)
}

func testCloseInFlight(t *testing.T, o Options) {
	p := newPair(t, o)
	p.warmup()
	rec := newRecorder()
	rec.gate = make(chan struct{})
	rec.discard = true
	p.b.iface.SetAMHandler(amID, rec.handle)
	p.a.iface.SetAMHandler(amID, rec.handle)
	a := p.a.attr
	gateOpen := false
	openGate := func() {
		if !gateOpen {
			gateOpen = true
			close(rec.gate)
		}
	}
	defer openGate()
	var comps []*completion
	var pin runtime.Pinner
	defer pin.Unpin()
	zsize := min(a.MaxZcopy, 64<<10)
	zbuf := make([]byte, max(zsize, 1))
	pin.Pin(&zbuf[0])
	var zh uct.MemH
	if a.Cap.Has(uct.CapAMZcopy) && p.a.md.Attr().Flags&uct.MDCanRegister != 0 {
		h, err := p.a.md.Register(zbuf, uct.AccessLocalRead)
		if err != nil {
			t.Fatal(err)
		}
		zh = h
		// Deregistered after the EP is closed, below.
	}
	deadline := time.Now().Add(20 * time.Second)
	full := false
	for i := 0; i < 100000 && !full && time.Now().Before(deadline); i++ {
		var err error
		switch {
		case a.Cap.Has(uct.CapAMZcopy) && i%2 == 0:
			cp := newCompletion()
			err = p.a.ep.AMZcopy(amID, nil, []uct.IOV{{Buf: zbuf[:zsize], MemH: zh}}, cp.c)
			if errors.Is(err, uct.ErrInProgress) {
				comps = append(comps, cp)
			}
		case a.Cap.Has(uct.CapAMBcopy):
			_, err = p.a.ep.AMBcopy(amID, func(b []byte) int { return len(b) })
		default:
			err = amSeq(p.a, uint64(i))
		}
		if errors.Is(err, uct.ErrNoResource) {
			full = true
		} else if err != nil && !errors.Is(err, uct.ErrInProgress) {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	t.Logf("in flight at close: %d zcopy completions, send queue full: %v", len(comps), full)
	if full {
		req := &uct.PendingReq{Func: func() error { return nil }}
		if err := p.a.ep.PendingAdd(req); err != nil && !errors.Is(err, uct.ErrBusy) {
			t.Errorf("PendingAdd: %v", err)
		}
	}
	cpFlush := newCompletion()
	flushErr := p.a.ep.Flush(cpFlush.c)
	// Close the sending EP while its operations are stuck behind the stalled receiver.
	closed := make(chan error, 1)
	go func() { closed <- p.a.ep.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("EP.Close with operations in flight: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("EP.Close hangs with operations in flight")
	}
	for i, cp := range comps {
		select {
		case <-cp.ch: // canceled or done: either is fine
		case <-time.After(10 * time.Second):
			t.Fatalf("AMZcopy #%d of %d in flight: completion never fired after EP.Close", i, len(comps))
		}
	}
	if errors.Is(flushErr, uct.ErrInProgress) {
		select {
		case <-cpFlush.ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("Flush completion never fired after EP.Close")
		}
	}
	if zh != nil {
		if err := p.a.md.Deregister(zh); err != nil {
			t.Errorf("deregister: %v", err)
		}
	}
	if err := p.a.ep.Close(); err != nil {
		t.Errorf("second EP.Close: %v", err)
	}
	if err := amSeq(p.a, 1); err == nil {
		t.Errorf("send on a closed EP: no error")
	}
	if err := p.a.ep.PendingAdd(&uct.PendingReq{Func: func() error { return nil }}); err == nil {
		t.Errorf("PendingAdd on a closed EP: no error")
	}
	// Now the other direction: b sends to a, a's iface closes under it.
	openGate()
	for i := 0; i < 200; i++ {
		err := amSeq(p.b, uint64(i))
		if err != nil && !errors.Is(err, uct.ErrNoResource) {
			t.Fatalf("send b->a %d: %v", i, err)
		}
	}
	ifClosed := make(chan error, 1)
	go func() { ifClosed <- p.a.iface.Close() }()
	select {
	case <-ifClosed:
	case <-time.After(10 * time.Second):
		t.Fatalf("Iface.Close hangs with messages arriving")
	}
	// Sends towards a closed iface fail or are dropped; they must not panic or block.
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		for i := 0; i < 100; i++ {
			amSeq(p.b, uint64(i))
			time.Sleep(100 * time.Microsecond)
		}
	}()
	select {
	case <-sent:
	case <-time.After(10 * time.Second):
		t.Fatalf("sends to a closed iface block")
	}
}

// regRemote registers buf on s's MD for remote access and returns the
// address and packed rkey a peer names it by.
func regRemote(t *testing.T, s *side, buf []byte, pin *runtime.Pinner) (uint64, []byte) {
	t.Helper()
	if len(buf) > 0 {
		pin.Pin(&buf[0])
	}
	h, err := s.md.Register(buf, uct.AccessLocalRead|uct.AccessLocalWrite|uct.AccessRemoteRead|uct.AccessRemoteWrite)
	if err != nil {
		t.Fatalf("register %d bytes: %v", len(buf), err)
	}
	t.Cleanup(func() { s.md.Deregister(h) })
	rkey, err := s.md.PackRKey(h)
	if err != nil {
		t.Fatalf("pack rkey: %v", err)
	}
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))), rkey
}

func rma(t *testing.T, s *side, get bool, local []byte, niov int, raddr uint64, rkey []byte) error {
	t.Helper()
	iov := split(local, niov)
	acc := uct.AccessLocalRead
	if get {
		acc = uct.AccessLocalWrite
	}
	done := register(t, s.md, iov, acc)
	defer done()
	cp := newCompletion()
	var err error
	if get {
		err = retry(func() error { return s.ep.GetZcopy(iov, raddr, rkey, cp.c) })
	} else {
		err = retry(func() error { return s.ep.PutZcopy(iov, raddr, rkey, cp.c) })
	}
	return cp.result(t, err, "RMA")
}

func testRMA(t *testing.T, o Options) {
	p := newPair(t, o)
	a := p.a.attr
	if !a.Cap.Has(uct.CapPutZcopy) && !a.Cap.Has(uct.CapGetZcopy) {
		// A transport without RMA must say so.
		err := p.a.ep.PutZcopy(nil, 0, nil, nil)
		if !errors.Is(err, uct.ErrNotSupported) {
			t.Errorf("PutZcopy without CapPutZcopy: %v, want ErrNotSupported", err)
		}
		err = p.a.ep.GetZcopy(nil, 0, nil, nil)
		if !errors.Is(err, uct.ErrNotSupported) {
			t.Errorf("GetZcopy without CapGetZcopy: %v, want ErrNotSupported", err)
		}
		t.Skipf("%s has no RMA", o.TL)
	}
	r := rand.New(rand.NewPCG(9, 10))
	var pin runtime.Pinner
	defer pin.Unpin()
	for _, get := range []bool{false, true} {
		op, capb, lim := "PutZcopy", uct.CapPutZcopy, a.MaxPut
		if get {
			op, capb, lim = "GetZcopy", uct.CapGetZcopy, a.MaxGet
		}
		if !a.Cap.Has(capb) {
			continue
		}
		for _, size := range []int{0, 1, 4097, min(lim, 4<<20)} {
			// The remote buffer has guard bytes either side of the target range.
			const guard = 64
			remote := randBytes(r, size+2*guard)
			orig := append([]byte(nil), remote...)
			raddr, rkey := regRemote(t, p.b, remote, &pin)
			local := randBytes(r, size)
			if err := rma(t, p.a, get, local, a.MaxIOV, raddr+guard, rkey); err != nil {
				t.Fatalf("%s %d bytes: %v", op, size, err)
			}
			cp := newCompletion()
			if err := cp.result(t, p.a.ep.Flush(cp.c), "Flush"); err != nil {
				t.Fatalf("Flush after %s: %v", op, err)
			}
			if get {
				if !bytes.Equal(local, orig[guard:guard+size]) {
					t.Errorf("%s %d bytes: data differs", op, size)
				}
				if !bytes.Equal(remote, orig) {
					t.Errorf("%s %d bytes: the remote buffer changed", op, size)
				}
			} else {
				want := append(append(append([]byte(nil), orig[:guard]...), local...), orig[guard+size:]...)
				if !bytes.Equal(remote, want) {
					t.Errorf("%s %d bytes: remote buffer differs (or guard bytes touched)", op, size)
				}
			}
		}
	}
}

func testRMABounds(t *testing.T, o Options) {
	p := newPair(t, o)
	a := p.a.attr
	if !a.Cap.Has(uct.CapPutZcopy) && !a.Cap.Has(uct.CapGetZcopy) {
		t.Skipf("%s has no RMA", o.TL)
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	// The target sits between two buffers that must never be touched.
	before := bytes.Repeat([]byte{0xAA}, 4096)
	remote := bytes.Repeat([]byte{0x55}, 4096)
	after := bytes.Repeat([]byte{0xBB}, 4096)
	raddr, rkey := regRemote(t, p.b, remote, &pin)
	badKey := bytes.Repeat([]byte{0xEE}, max(len(rkey), 8))
	cases := []struct {
		what  string
		addr  uint64
		size  int
		rkey  []byte
		fresh bool
	}{
		{"one byte past the end", raddr + 4096, 1, rkey, false},
		{"straddling the end", raddr + 4095, 2, rkey, false},
		{"before the start", raddr - 1, 2, rkey, false},
		{"address 0", 0, 8, rkey, false},
		{"wrapping address", ^uint64(0) - 2, 8, rkey, false},
		{"garbage rkey", raddr, 8, badKey, false},
		{"short rkey", raddr, 8, rkey[:len(rkey)/2], false},
		{"nil rkey", raddr, 8, nil, false},
	}
	for _, get := range []bool{false, true} {
		capb := uct.CapPutZcopy
		if get {
			capb = uct.CapGetZcopy
		}
		if !a.Cap.Has(capb) {
			continue
		}
		for _, c := range cases {
			// Each bad access may break the connection (an RC QP enters the
			// error state), so each gets a fresh pair.
			q := newPair(t, o)
			local := bytes.Repeat([]byte{0x11}, c.size)
			err := rma(t, q.a, get, local, 1, c.addr, c.rkey)
			if err == nil {
				t.Errorf("get=%v %s: no error", get, c.what)
			}
			if get && !bytes.Equal(local, bytes.Repeat([]byte{0x11}, c.size)) {
				t.Errorf("GetZcopy %s: read %x", c.what, local)
			}
			q.close()
		}
	}
	runtime.KeepAlive(before)
	runtime.KeepAlive(after)
	if !bytes.Equal(remote, bytes.Repeat([]byte{0x55}, 4096)) || !bytes.Equal(before, bytes.Repeat([]byte{0xAA}, 4096)) ||
		!bytes.Equal(after, bytes.Repeat([]byte{0xBB}, 4096)) {
		t.Errorf("an out-of-range access wrote memory")
	}
}

func testConcurrent(t *testing.T, o Options) {
	p := newPair(t, o)
	const senders, per = 4, 500
	recs := []*recorder{newRecorder(), newRecorder()}
	p.b.iface.SetAMHandler(amID, recs[0].handle)
	p.a.iface.SetAMHandler(amID, recs[1].handle)
	var wg sync.WaitGroup
	errs := make(chan error, 2*senders)
	for si, s := range []*side{p.a, p.b} {
		for g := 0; g < senders; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(si), uint64(g)))
				for i := 0; i < per; i++ {
					seq := uint64(g)<<32 | uint64(i)
					var err error
					k := r.IntN(3)
					switch {
					case k == 1 && s.attr.Cap.Has(uct.CapAMBcopy):
						d := binary.LittleEndian.AppendUint64(nil, seq)
						d = append(d, make([]byte, r.IntN(max(s.attr.MaxBcopy-8, 0)+1))...)
						err = retry(func() error { return bcopy(s.ep, d) })
					case k == 2 && s.attr.Cap.Has(uct.CapAMZcopy):
						d := binary.LittleEndian.AppendUint64(nil, seq)
						d = append(d, make([]byte, r.IntN(max(min(s.attr.MaxZcopy, 64<<10)-8, 0)+1))...)
						err = sendKind(t, s, kindZcopy, d)
					default:
						err = retry(func() error { return amSeq(s, seq) })
					}
					if err != nil {
						errs <- fmt.Errorf("sender %d/%d message %d: %w", si, g, i, err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for ri, rec := range recs {
		got := rec.wait(t, senders*per, 30*time.Second)
		next := make([]uint32, senders)
		for _, m := range got {
			seq := binary.LittleEndian.Uint64(m)
			g, i := seq>>32, uint32(seq)
			if g >= senders || i != next[g] {
				t.Fatalf("direction %d: sender %d message %d, want %d (per-sender order broken)", ri, g, i, next[g%senders])
			}
			next[g]++
		}
	}
}

func testReachable(t *testing.T, o Options) {
	p := newPair(t, o)
	dev, ifa := p.b.iface.DeviceAddress(), p.b.iface.IfaceAddress()
	if !p.a.iface.IsReachable(dev, ifa) {
		t.Errorf("IsReachable(peer) = false")
	}
	if !p.a.iface.IsReachable(p.a.iface.DeviceAddress(), p.a.iface.IfaceAddress()) {
		t.Errorf("IsReachable(itself) = false")
	}
	r := rand.New(rand.NewPCG(11, 12))
	garbage := [][2][]byte{
		{nil, nil},
		{randBytes(r, len(dev)+1), ifa},
		{randBytes(r, 3), randBytes(r, 3)},
		{randBytes(r, 64), randBytes(r, 64)},
	}
	if len(dev) > 0 {
		garbage = append(garbage, [2][]byte{dev[:len(dev)-1], ifa})
		bad := append([]byte(nil), dev...)
		bad[0] ^= 0xFF
		garbage = append(garbage, [2][]byte{bad, ifa})
	}
	if p.a.attr.Cap.Has(uct.CapConnectToIface) {
		garbage = append(garbage, [2][]byte{dev, randBytes(r, len(ifa)+3)})
		if len(ifa) > 0 {
			garbage = append(garbage, [2][]byte{dev, ifa[:len(ifa)-1]})
		}
	}
	for i, g := range garbage {
		if p.a.iface.IsReachable(g[0], g[1]) {
			t.Errorf("IsReachable(garbage #%d: %x, %x) = true", i, g[0], g[1])
		}
	}
	if p.a.attr.Cap.Has(uct.CapConnectToIface) {
		// Connecting to garbage fails, or yields an EP (transports that
		// connect lazily) that closes without hanging.
		for _, g := range garbage[:3] {
			ep, err := p.a.iface.CreateEP(uct.EPParams{DevAddr: g[0], IfaceAddr: append(g[1], 0)})
			if err == nil {
				done := make(chan struct{})
				go func() { ep.Close(); close(done) }()
				select {
				case <-done:
				case <-time.After(10 * time.Second):
					t.Fatalf("closing an EP to garbage addresses hangs")
				}
			}
		}
	}
}

func testIdle(t *testing.T, o Options) {
	p := newPair(t, o)
	rec := newRecorder()
	p.b.iface.SetAMHandler(amID, rec.handle)
	if err := retry(func() error { return amSeq(p.a, 0) }); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, 1, 10*time.Second)
	// A worker is parked when it has gone to sleep more often than it woke.
	parked := func(w *uct.Worker) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			wk := w.Wakeups.Load()
			if w.Sleeps.Load() > wk {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("worker did not park within 5s of the last message (sleeps %d, wakeups %d)", w.Sleeps.Load(), wk)
			}
			time.Sleep(time.Millisecond)
		}
	}
	parked(p.a.w)
	parked(p.b.w)
	time.Sleep(20 * time.Millisecond)
	g0 := runtime.NumGoroutine()
	c0, ok := cpuTime()
	w0 := time.Now()
	sa, sb := p.a.w.Sleeps.Load(), p.b.w.Sleeps.Load()
	time.Sleep(300 * time.Millisecond)
	if g := runtime.NumGoroutine(); g > g0 {
		t.Errorf("goroutines grew while idle: %d -> %d", g0, g)
	}
	if c1, _ := cpuTime(); ok {
		if frac := float64(c1-c0) / float64(time.Since(w0)); frac > 0.25 {
			t.Errorf("idle pair used %.0f%% of a CPU", 100*frac)
		}
	}
	// Parked workers stay parked: at most a few spurious wake-ups.
	if d := p.a.w.Sleeps.Load() - sa + p.b.w.Sleeps.Load() - sb; d > 20 {
		t.Errorf("workers woke %d times in 300ms of idle", d)
	}
	wk := p.b.w.Wakeups.Load()
	if err := retry(func() error { return amSeq(p.a, 1) }); err != nil {
		t.Fatal(err)
	}
	checkSeq(t, rec.wait(t, 2, 5*time.Second), 0)
	// The worker wakes (a transport may also run the handler from its
	// event goroutine under the progress lock, before the worker runs).
	for deadline := time.Now().Add(2 * time.Second); p.b.w.Wakeups.Load() == wk; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("message delivered but the parked receiver worker never woke")
		}
	}
}
