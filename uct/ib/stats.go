package ib

import "sync/atomic"

// RegStats counts this process's memory registrations with RDMA devices,
// every MD together (leak accounting; published by internal/rt in the
// expvar map "rdmanet").
type RegStats struct {
	// Live and Total count per-operation registrations of caller memory
	// (MD.Register: a rendezvous registers the user's buffer per
	// transfer). Live returns to its baseline when every conn is closed.
	Live, Total int64
	// Allocs counts live registered allocations (MD.MemAlloc): library
	// buffers such as the stream's bounded rendezvous staging pool.
	Allocs int64
	// Slabs counts the live registered slabs of the ifaces' buffer pools
	// (bounce and receive buffers): they live as long as their iface.
	Slabs int64
}

var regLive, regTotal, regAllocs, regSlabs atomic.Int64

// Registrations returns a snapshot of the registration counters. Safe for
// concurrent use.
func Registrations() RegStats {
	return RegStats{Live: regLive.Load(), Total: regTotal.Load(), Allocs: regAllocs.Load(), Slabs: regSlabs.Load()}
}
