// Package stream is a byte stream (net.Conn) over uct active messages: the
// data path of rdmanet conns (DESIGN.md "internal/stream").
//
// A Mux binds the stream's handlers on one opened iface and routes incoming
// messages to conns by id. The wireup creates a Conn with Mux.NewConn,
// exchanges conn ids and transport addresses with the peer over the
// bootstrap socket, connects an EP and calls Conn.Start, handing over the
// bootstrap socket as the conn's liveness channel.
//
// Protocols, by Write size (thresholds from the iface's attributes):
// up to MaxShort one AMShort; up to the rendezvous threshold AMBcopy
// fragments pipelined within the peer's credit; above it, with GetZcopy,
// rendezvous: the writer registers its buffer and sends RTS; the receiver
// pulls with GetZcopy — straight into a waiting Read's buffer when it is
// large, else into its receive queue (a goroutine pulls ahead, up to the
// window, while no Read runs) — and answers ATS, which releases the
// writer. The rendezvous threshold is Config.RndvThresh, or derived from
// the MD's registration cost and the iface's latency and bandwidth
// (64–256 KiB); on shared memory, where a get is a CPU copy no faster than
// the ring's, it is 4 MiB (shmRndvThresh). The receiver grants a byte
// window (Config.RxWindow) for copied data; credits return as the
// application reads, batched at a quarter window and piggybacked on every
// outgoing message. Received data is copied straight into the buffer of a
// blocked Read while nothing is queued, else into 64 KiB chunks from a
// per-Mux pool. The wire format is documented in wire.go.
//
// Blocked calls first poll the transport themselves (Worker.TryProgress)
// for Config.ReadSpin, then park until a handler signals them; handlers
// and completions never block and only hand off and signal.
//
// Liveness (the ctl socket, after Start): the only bytes on it are one
// notice written just before the socket is closed: 'C' after a graceful
// Close (FIN sent and the endpoint flushed first, so the peer reads every
// byte, then io.EOF, whichever of FIN and the notice it sees first), 'R'
// after Abort. The socket ending without 'C' resets the conn at once;
// after 'C', Writes to the closed peer fail with ErrPeerClosed.
package stream
