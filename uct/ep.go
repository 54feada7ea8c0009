package uct

// EPParams are given to Iface.CreateEP.
type EPParams struct {
	// DevAddr, IfaceAddr of the peer iface (connect-to-iface). Leave
	// IfaceAddr nil to create an unconnected EP (connect-to-EP).
	DevAddr   []byte
	IfaceAddr []byte
}

// PendingReq is queued by EP.PendingAdd. Func runs on the worker when the
// endpoint may have resources again; it returns nil when it made progress and
// is done, or ErrNoResource to stay queued (at the head). A PendingReq may be
// queued on one endpoint at a time.
type PendingReq struct {
	Func func() error
}

// EP is an endpoint: a connection to one peer iface or endpoint. Methods are
// safe for concurrent use. Send calls return nil when done (buffers may be
// reused), ErrInProgress when the Completion will fire later (zero-copy
// buffers must stay untouched until then), or ErrNoResource.
type EP interface {
	// AMShort sends hdr (8 bytes, little-endian on the wire) and payload
	// (at most MaxShort bytes) as AM id.
	AMShort(id uint8, hdr uint64, payload []byte) error
	// AMBcopy calls pack with a buffer of MaxBcopy bytes to fill and sends
	// what pack wrote (its return value). It returns that length.
	AMBcopy(id uint8, pack func(buf []byte) int) (int, error)
	// AMZcopy sends header then iov, without copying iov where the transport
	// can; comp fires when iov may be reused.
	AMZcopy(id uint8, header []byte, iov []IOV, comp *Completion) error
	// PutZcopy writes iov to the peer's memory at raddr (RDMA WRITE).
	PutZcopy(iov []IOV, raddr uint64, rkey []byte, comp *Completion) error
	// GetZcopy reads the peer's memory at raddr into iov (RDMA READ).
	GetZcopy(iov []IOV, raddr uint64, rkey []byte, comp *Completion) error
	// Flush completes every operation posted before it: nil when already
	// done, or ErrInProgress and comp fires later.
	Flush(comp *Completion) error
	// PendingAdd queues r to run when resources free up. It returns ErrBusy
	// when resources are available now (retry the send instead).
	PendingAdd(r *PendingReq) error
	// PendingPurge removes every queued request, calling cb on each.
	PendingPurge(cb func(r *PendingReq))
	// Address is this EP's address for ConnectToEP (CapConnectToEP).
	Address() ([]byte, error)
	// ConnectToEP connects an unconnected EP to the peer's EP address.
	ConnectToEP(devAddr, epAddr []byte) error
	// Close releases the endpoint; operations in flight complete with
	// ErrCanceled (or ErrEndpointReset). Close is idempotent.
	Close() error
}
