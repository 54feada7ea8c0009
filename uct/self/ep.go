package self

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"

	"github.com/gouct/gouct/uct"
)

type ep struct {
	iface   *iface
	target  *iface
	pending uct.PendingQueue
	closed  atomic.Bool
}

func (e *ep) check() error {
	if e.closed.Load() {
		return uct.ErrClosed
	}
	return nil
}

func (e *ep) AMShort(id uint8, hdr uint64, payload []byte) error {
	if err := e.check(); err != nil {
		return err
	}
	if id >= uct.MaxAMID || len(payload) > maxShort {
		return fmt.Errorf("self: am short %d bytes: %w", len(payload), uct.ErrMessageSize)
	}
	_, err := e.target.enqueue(id, func(b []byte) int {
		binary.LittleEndian.PutUint64(b, hdr)
		return 8 + copy(b[8:], payload)
	})
	return err
}

func (e *ep) AMBcopy(id uint8, pack func(buf []byte) int) (int, error) {
	if err := e.check(); err != nil {
		return 0, err
	}
	if id >= uct.MaxAMID {
		return 0, uct.ErrInvalidParam
	}
	return e.target.enqueue(id, pack)
}

func (e *ep) AMZcopy(id uint8, header []byte, iov []uct.IOV, comp *uct.Completion) error {
	if err := e.check(); err != nil {
		return err
	}
	if id >= uct.MaxAMID || len(header) > 64 || len(iov) > 8 || len(header)+uct.IOVLen(iov) > segSize {
		return fmt.Errorf("self: am zcopy: %w", uct.ErrMessageSize)
	}
	_, err := e.target.enqueue(id, func(b []byte) int {
		n := copy(b, header)
		for _, v := range iov {
			n += copy(b[n:], v.Buf)
		}
		return n
	})
	return err
}

func (e *ep) rma(iov []uct.IOV, raddr uint64, rkey []byte, get bool) error {
	if err := e.check(); err != nil {
		return err
	}
	need := uct.AccessRemoteWrite
	if get {
		need = uct.AccessRemoteRead
	}
	remote, err := resolve(rkey, raddr, uct.IOVLen(iov), need)
	if err != nil {
		return err
	}
	for _, v := range iov {
		if get {
			copy(v.Buf, remote)
		} else {
			copy(remote, v.Buf)
		}
		remote = remote[len(v.Buf):]
	}
	return nil
}

func (e *ep) PutZcopy(iov []uct.IOV, raddr uint64, rkey []byte, comp *uct.Completion) error {
	return e.rma(iov, raddr, rkey, false)
}

func (e *ep) GetZcopy(iov []uct.IOV, raddr uint64, rkey []byte, comp *uct.Completion) error {
	return e.rma(iov, raddr, rkey, true)
}

// Flush: every send completes when it is queued, so there is nothing to wait for.
func (e *ep) Flush(comp *uct.Completion) error { return e.check() }

func (e *ep) PendingAdd(r *uct.PendingReq) error {
	if err := e.check(); err != nil {
		return err
	}
	t := e.target
	t.mu.Lock()
	if t.count < queueLen {
		t.mu.Unlock()
		return uct.ErrBusy
	}
	e.pending.Add(r)
	t.waiters[e] = struct{}{}
	t.mu.Unlock()
	return nil
}

// dispatch runs on this EP's worker when the target freed room.
func (e *ep) dispatch() {
	e.pending.Dispatch()
	if e.pending.Len() > 0 {
		t := e.target
		t.mu.Lock()
		if t.count < queueLen {
			t.mu.Unlock()
			e.iface.w.Post(e.dispatch)
			return
		}
		t.waiters[e] = struct{}{}
		t.mu.Unlock()
	}
}

func (e *ep) PendingPurge(cb func(r *uct.PendingReq)) { e.pending.Purge(cb) }

func (e *ep) Address() ([]byte, error) { return nil, uct.NotSupported("self: ep address") }

func (e *ep) ConnectToEP(devAddr, epAddr []byte) error {
	return uct.NotSupported("self: connect to ep")
}

func (e *ep) Close() error {
	if e.closed.Swap(true) {
		return nil
	}
	t := e.target
	t.mu.Lock()
	delete(t.waiters, e)
	t.mu.Unlock()
	e.pending.Purge(nil)
	return nil
}
