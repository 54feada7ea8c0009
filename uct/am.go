package uct

import (
	"fmt"
	"sync/atomic"
)

// AMTable is an iface's table of AM handlers, for transports to embed: it
// provides Iface.SetAMHandler. Handler and SetAMHandler are safe for
// concurrent use (a handler may be replaced while the worker polls).
type AMTable struct {
	h [MaxAMID]atomic.Pointer[AMHandler]
}

// SetAMHandler installs h for AM id; nil removes it.
func (t *AMTable) SetAMHandler(id uint8, h AMHandler) error {
	if id >= MaxAMID {
		return fmt.Errorf("uct: am id %d (max %d): %w", id, MaxAMID-1, ErrInvalidParam)
	}
	if h == nil {
		t.h[id].Store(nil)
	} else {
		t.h[id].Store(&h)
	}
	return nil
}

// Handler returns the handler of AM id, or nil when none is set or id is out of range.
func (t *AMTable) Handler(id uint8) AMHandler {
	if id >= MaxAMID {
		return nil
	}
	if p := t.h[id].Load(); p != nil {
		return *p
	}
	return nil
}
