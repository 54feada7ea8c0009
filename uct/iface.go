package uct

// LinearFunc is C + M·x (UCX ucs_linear_func_t); units are given where used.
type LinearFunc struct {
	C float64
	M float64
}

// At evaluates the function at x.
func (f LinearFunc) At(x float64) float64 { return f.C + f.M*x }

// Bandwidth in bytes per second: Dedicated to one process, plus Shared
// divided among the processes per node (UCX uct_ppn_bandwidth_t).
type Bandwidth struct {
	Dedicated float64
	Shared    float64
}

// Total is the bandwidth one process sees when ppn processes share the device.
func (b Bandwidth) Total(ppn int) float64 {
	if ppn < 1 {
		ppn = 1
	}
	return b.Dedicated + b.Shared/float64(ppn)
}

// IfaceAttr are the attributes of an interface.
type IfaceAttr struct {
	Cap Capability
	// Size limits in bytes (0 where the operation is not supported).
	MaxShort  int // payload of AMShort, excluding its 8-byte header
	MaxBcopy  int // bytes a pack function may write
	MaxZcopy  int // total iov bytes of one zero-copy operation
	MaxHeader int // header bytes of AMZcopy
	MaxIOV    int // iov elements per zero-copy operation
	// MaxGet/MaxPut: largest GetZcopy/PutZcopy.
	MaxGet, MaxPut int
	// Latency in seconds: C, plus M per connected endpoint.
	Latency LinearFunc
	// Bandwidth in bytes per second.
	Bandwidth Bandwidth
	// Overhead: CPU time in seconds to post one message.
	Overhead float64
	// Address lengths in bytes.
	DeviceAddrLen, IfaceAddrLen, EPAddrLen int
	// Priority breaks ties between equal estimates (higher wins).
	Priority int
	// MinSpin in seconds: how long a waiter should poll this iface before
	// parking, at least, because its events wake a parked waiter slowly
	// (software RDMA devices, whose "NIC" is kernel work competing for the
	// CPUs the waiters spin on). 0: no opinion (Config.ReadSpin applies).
	// Non-zero also keeps waiters (and the worker) polling under CPU
	// pressure (Config.SpinPressure): in a Soft-RoCE VM a parked waiter's
	// wake-up costs milliseconds, against tens of µs polled.
	MinSpin float64
}

// EstimateTime is the estimated one-way time in seconds to deliver a message
// of size bytes: latency + overhead + size/bandwidth (UCX wireup's score).
func (a IfaceAttr) EstimateTime(size int) float64 {
	bw := a.Bandwidth.Total(1)
	t := a.Latency.C + a.Overhead
	if bw > 0 {
		t += float64(size) / bw
	}
	return t
}

// IfaceParams are given to MD.OpenIface.
type IfaceParams struct {
	// Config; nil means DefaultConfig.
	Config *Config
	// ErrHandler, when set, is called on the worker when an endpoint fails
	// asynchronously (e.g. an RC QP entered the error state).
	ErrHandler func(ep EP, err error)
}

// Iface is a transport interface on a device, progressed by one Worker.
type Iface interface {
	Attr() IfaceAttr
	Resource() TLResource
	MD() MD
	// DeviceAddress and IfaceAddress identify this iface to peers.
	DeviceAddress() []byte
	IfaceAddress() []byte
	// IsReachable reports whether a peer with these addresses can be reached.
	IsReachable(devAddr, ifaceAddr []byte) bool
	// SetAMHandler installs h for AM id (0 <= id < MaxAMID); nil removes it.
	SetAMHandler(id uint8, h AMHandler) error
	// CreateEP creates an endpoint. With p.IfaceAddr set (CapConnectToIface)
	// it is connected to that iface; without (CapConnectToEP) it is
	// unconnected until EP.ConnectToEP.
	CreateEP(p EPParams) (EP, error)
	// Progress polls for events once, runs handlers and completions, and
	// returns how many events it handled. Called by the worker only.
	Progress() int
	// Arm asks the iface to call Worker.Wake on its next event. It returns
	// false when an event is already pending (the worker must poll again
	// instead of sleeping). Called by the worker only.
	Arm() bool
	// Close closes the iface; its endpoints must be closed first or are
	// closed by it.
	Close() error
}
