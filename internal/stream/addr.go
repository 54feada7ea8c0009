package stream

// Addr is the net.Addr of rdmanet conns and listeners: Network() is Net
// ("rdma"), String() the host:port of the bootstrap socket.
type Addr struct {
	Net  string
	Addr string
}

// Network returns a.Net, "rdma" when empty.
func (a Addr) Network() string {
	if a.Net == "" {
		return "rdma"
	}
	return a.Net
}

func (a Addr) String() string { return a.Addr }

// Stats are a conn's counters, read with Conn.Stats.
type Stats struct {
	// Transport is the transport the conn runs on ("self", "shm", "rc_verbs/rxe0:1").
	Transport string
	// BytesRead and BytesWritten count application bytes.
	BytesRead, BytesWritten uint64
	// MsgShort, MsgBcopy and MsgRndv count messages written, by protocol:
	// AMShort and AMBcopy DATA fragments, and rendezvous requests.
	MsgShort, MsgBcopy, MsgRndv uint64
	// Fallback says why the conn fell back to TCP; "" when it did not (always
	// "" for a stream Conn; the wireup fills it for TCP conns).
	Fallback string
}
