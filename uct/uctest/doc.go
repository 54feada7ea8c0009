// Package uctest is the shared conformance suite of uct transports (UCX
// gtest's test_uct_* instantiated for every transport): one call runs every
// check a transport's capabilities allow, and skips the rest by capability.
//
// From a transport's _test.go:
//
//	import _ "github.com/gouct/gouct/uct/tcp"
//
//	func TestSuite(t *testing.T) { uctest.Run(t, "tcp") }
//	func TestSuiteDev(t *testing.T) { // first resource of the TL on that device
//		uctest.RunOptions(t, uctest.Options{TL: "rc_verbs", Device: "rxe0:1"})
//	}
//	func BenchmarkPingPong64(b *testing.B)  { uctest.BenchPingPong(b, "tcp", 64) }
//	func BenchmarkBandwidth1M(b *testing.B) { uctest.BenchBandwidth(b, "tcp", 1<<20) }
//
// Each subtest opens a fresh pair: two workers, each with its own MD and
// iface of the transport opened through the component registry
// (uct.Components, Component.OpenMD, MD.TLResources, MD.OpenIface), connected
// both ways (EP to iface with CapConnectToIface, else EP to EP by exchanging
// EP.Address). The transport package must be imported (for its init) by the
// caller. A missing resource fails the test unless Options.SkipIfAbsent.
// Zero-copy buffers are registered with MD.Register when the MD has
// MDCanRegister (pinned with runtime.Pinner meanwhile); an empty IOV
// element carries a nil MemH.
//
// What the subtests check:
//
//   - AMShort at 0, 1 and MaxShort bytes; MaxShort+1 is an error.
//   - AMBcopy at 0, 1, MaxShort+1 and MaxBcopy bytes; a pack function that
//     returns more than MaxBcopy (or less than 0) is an error.
//   - AMZcopy at size boundaries up to MaxZcopy (4 MiB at most), with a header and several
//     IOVs, waiting on the Completion when it returns ErrInProgress.
//   - Integrity: random payloads of random sizes over every AM kind, each
//     carrying its CRC-32, arrive intact and in order.
//   - Ordering: many messages on one EP arrive in the order sent.
//   - Pending: with the receiver stalled the sender gets ErrNoResource
//     (buffering is bounded); PendingAdd then delivers everything, no loss
//     and no duplicate, in order.
//   - Flush: nil or ErrInProgress and the completion fires.
//   - CloseInFlight: closing EPs and ifaces with operations in flight does
//     not panic or hang; completions fire (canceled or not); later sends fail.
//   - RMA: PutZcopy/GetZcopy through MD.Register/PackRKey at 0 bytes up to
//     4 MiB; out-of-range addresses and bad rkeys are errors and touch no
//     memory outside the registration.
//   - Concurrent: several goroutines send on both sides at once; handlers of
//     one worker never overlap.
//   - Reachable: IsReachable is true for the peer, false for garbage.
//   - Idle: both workers park (Worker.Sleeps grows, goroutines and CPU stay
//     flat) and a message wakes them.
//   - Leaks: every goroutine the suite's pairs started has exited at the end.
//
// BenchPingPong and BenchBandwidth measure AM latency and streaming
// bandwidth of a transport and, in the same run, the same pattern over a Go
// TCP loopback net.Conn, reported beside it as tcp-ns/op (or tcp-MB/s) and
// a ratio (x-tcp: ours divided by TCP's).
//
// Handlers in this suite copy and signal, except the Pending and
// CloseInFlight subtests, which deliberately stall the receiving worker in a
// handler to create back-pressure.
package uctest
