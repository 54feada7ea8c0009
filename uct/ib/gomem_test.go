package ib_test

import (
	"bytes"
	"testing"
	"unsafe"

	"github.com/gouct/gouct/uct"
)

// msgHolder is user memory as a Conn Write may see it: byte buffers inside
// a heap object that also holds Go pointers (cgo's pointer check rejects
// such memory when its address is passed to C as a pointer).
type msgHolder struct {
	next  *msgHolder
	name  string
	small [48]byte
	ptrs  []*int
	big   [16 << 10]byte
}

// TestGoMemoryWithPointers: AMShort from a byte array field of a struct
// holding pointers (the rc_verbs Conn crash: "cgo argument has Go pointer
// to unpinned Go pointer" from PostInline), then registration, AMZcopy and
// RMA from/into another such field.
func TestGoMemoryWithPointers(t *testing.T) {
	a, b := newPair(t)
	inB := newInbox(b, 5)
	x := 7
	h := &msgHolder{name: "holder", ptrs: []*int{&x}}
	h.next = &msgHolder{name: "other"}
	copy(h.small[:], "a small message inside a struct with pointers")
	n := min(len(h.small), a.iface.Attr().MaxShort)
	for range 3 { // several sends: the check fires at the first one
		if err := retry(func() error { return a.ep.AMShort(5, 9, h.small[:n]) }); err != nil {
			t.Fatalf("AMShort: %v", err)
		}
		if got := inB.next(t); got[0] != 9 || !bytes.Equal(got[8:], h.small[:n]) {
			t.Fatalf("AMShort got %q", got)
		}
	}
	for i := range h.big {
		h.big[i] = byte(i * 3)
	}
	zh, err := a.md.Register(h.big[:], uct.AccessLocalRead|uct.AccessLocalWrite)
	if err != nil {
		t.Fatalf("Register a field of a struct with pointers: %v", err)
	}
	defer a.md.Deregister(zh)
	z := h.big[:min(len(h.big), a.iface.Attr().MaxZcopy-4)] // the header counts in MaxZcopy
	c, ch := comp()
	if err := wait(t, a.ep.AMZcopy(5, h.small[:4], []uct.IOV{{Buf: z, MemH: zh}}, c), ch); err != nil {
		t.Fatalf("AMZcopy: %v", err)
	}
	if got := inB.next(t); !bytes.Equal(got[:4], h.small[:4]) || !bytes.Equal(got[4:], z) {
		t.Fatalf("AMZcopy: got %d bytes", len(got))
	}
	r := &msgHolder{name: "remote", next: h}
	rh, err := b.md.Register(r.big[:], uct.AccessLocalWrite|uct.AccessRemoteWrite|uct.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	defer b.md.Deregister(rh)
	rkey, _ := b.md.PackRKey(rh)
	c, ch = comp()
	if err := wait(t, a.ep.PutZcopy([]uct.IOV{{Buf: h.big[:], MemH: zh}}, addrOf(r.big[:]), rkey, c), ch); err != nil {
		t.Fatalf("PutZcopy: %v", err)
	}
	if r.big != h.big {
		t.Fatal("PutZcopy: remote differs")
	}
	if h.next.name != "other" || *h.ptrs[0] != 7 || r.next != h {
		t.Fatal("pointer fields changed")
	}
}

func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }

// TestRegisterNoAlloc: a registration of user memory (the stream's
// rendezvous registers per Write) allocates nothing once warm, and a
// recycled handle packs its own rkey.
func TestRegisterNoAlloc(t *testing.T) {
	a, _ := newPair(t)
	buf := make([]byte, 256<<10)
	var rk []byte
	reg := func() {
		h, err := a.md.Register(buf, uct.AccessRemoteRead)
		if err != nil {
			t.Fatal(err)
		}
		if rk, err = a.md.PackRKey(h); err != nil || len(rk) != 4 {
			t.Fatalf("PackRKey: %x %v", rk, err)
		}
		if err := a.md.Deregister(h); err != nil {
			t.Fatal(err)
		}
	}
	reg()
	if n := testing.AllocsPerRun(100, reg); n > 0 {
		t.Errorf("Register+PackRKey+Deregister: %.1f allocations, want 0", n)
	}
	h1, _ := a.md.Register(buf[:4096], uct.AccessRemoteRead)
	h2, _ := a.md.Register(buf[4096:8192], uct.AccessRemoteRead)
	k1, _ := a.md.PackRKey(h1)
	k2, _ := a.md.PackRKey(h2)
	if bytes.Equal(k1, k2) {
		t.Errorf("two live registrations share rkey %x", k1)
	}
	a.md.Deregister(h1)
	a.md.Deregister(h2)
}
