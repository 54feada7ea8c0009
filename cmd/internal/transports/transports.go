// Package transports links every uct transport into the commands: importing
// it registers each component (self, shm, tcp, ib) for its side effect, so
// rdmanet-info and rdmanet-perf see the same set.
package transports

import (
	_ "github.com/gouct/gouct/uct/ib"   // rc_verbs (unavailable, saying why, without cgo or libibverbs)
	_ "github.com/gouct/gouct/uct/self" // in-process loopback
	_ "github.com/gouct/gouct/uct/shm"  // shared memory between processes
	_ "github.com/gouct/gouct/uct/tcp"  // TCP sockets
)
