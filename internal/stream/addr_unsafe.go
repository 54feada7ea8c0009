package stream

import "unsafe"

// addrOf is the virtual address of p's first byte, as sent in an RTS: the
// peer names it in GetZcopy together with the rkey of p's registration.
func addrOf(p []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(p)))) }
