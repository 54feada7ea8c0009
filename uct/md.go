package uct

// Access flags for memory registration. Keep them minimal: remote read only
// on zero-copy sources, and only for the transfer.
type Access uint32

const (
	AccessLocalRead Access = 1 << iota
	AccessLocalWrite
	AccessRemoteRead
	AccessRemoteWrite
)

// MemH is an opaque memory registration handle. nil is valid for MDs whose
// attributes do not set MDNeedMemH.
type MemH interface{}

// MDFlags describe a memory domain.
type MDFlags uint32

const (
	MDCanRegister MDFlags = 1 << iota // Register is meaningful (pins/registers memory)
	MDNeedMemH                        // zero-copy IOVs must carry a MemH
	MDNeedRKey                        // remote access needs a packed rkey
	MDODP                             // on-demand paging registrations
)

// MDAttr are the attributes of a memory domain.
type MDAttr struct {
	Flags MDFlags
	// RegCost is the registration cost: C seconds + M seconds per byte (UCX
	// reg_cost; 16 µs + 0.06 ns/B for verbs).
	RegCost LinearFunc
	// MaxReg is the largest registration in bytes (0: no limit).
	MaxReg uint64
	// RKeySize is the packed rkey size in bytes.
	RKeySize int
}

// Mem is library-owned memory from MD.MemAlloc: off the Go heap and
// registered for the MD's lifetime.
type Mem struct {
	Buf  []byte
	MemH MemH
}

// MD is a memory domain: registration, rkeys, and the transport resources it
// can open interfaces on. Methods are safe for concurrent use.
type MD interface {
	Name() string
	Component() Component
	Attr() MDAttr
	// Register registers b for the access given. The caller keeps b alive
	// and unmodified as required by the operations using it, until Deregister.
	Register(b []byte, access Access) (MemH, error)
	Deregister(MemH) error
	// PackRKey returns a packed remote key for a registration made with
	// remote access, to be sent to the peer along with the buffer address.
	PackRKey(MemH) ([]byte, error)
	// MemAlloc allocates size bytes off the Go heap, registered; MemFree releases it.
	MemAlloc(size int) (Mem, error)
	MemFree(Mem) error
	// TLResources lists the transport resources (transport on device).
	TLResources() ([]TLResource, error)
	// OpenIface opens an interface on resource tl, progressed by w.
	OpenIface(w *Worker, tl TLResource, p IfaceParams) (Iface, error)
	Close() error
}

// DeviceType classifies a TL resource.
type DeviceType int

const (
	DeviceNet  DeviceType = iota // network device (ib, tcp)
	DeviceShm                    // shared memory between processes
	DeviceSelf                   // loopback inside the process
)

func (t DeviceType) String() string {
	switch t {
	case DeviceNet:
		return "net"
	case DeviceShm:
		return "shm"
	case DeviceSelf:
		return "self"
	}
	return "unknown"
}

// TLResource is a transport on a device: ("rc_verbs", "rxe0:1"), ("shm", "memory").
type TLResource struct {
	TL     string
	Device string
	Type   DeviceType
}

// Name is "tl/device", e.g. "rc_verbs/rxe0:1".
func (r TLResource) Name() string { return r.TL + "/" + r.Device }
