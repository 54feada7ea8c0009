package stream

import (
	"encoding/binary"
	"errors"
)

// Active message ids of the stream protocol. A Mux installs a handler for
// each on its iface, so one iface carries one Mux.
const (
	amData   uint8 = 16 + iota // DATA: payload bytes
	amCredit                   // CREDIT: window grant only
	amRTS                      // RTS: rendezvous request
	amATS                      // ATS: rendezvous done
	amFIN                      // FIN: end of stream (half-close)
	amRST                      // RST: abort, with a code
)

// Wire format. Every stream active message starts with the same 8-byte
// header; for AMShort it is the 64-bit header argument (little-endian on the
// wire), for AMBcopy the first 8 bytes the pack function writes. All integers
// are little-endian.
//
//	| offset | size | field  | meaning                                                   |
//	|--------|------|--------|-----------------------------------------------------------|
//	| 0      | 4    | conn   | destination conn id (Conn.ID of the receiver)             |
//	| 4      | 4    | credit | receive-window bytes granted back to the receiver's writer |
//
// The body after the header, by AM id:
//
//	| AM     | body                                                              | credit-counted |
//	|--------|-------------------------------------------------------------------|----------------|
//	| DATA   | payload, 1..max(MaxShort, MaxBcopy-8) bytes                       | yes            |
//	| CREDIT | empty                                                             | no             |
//	| RTS    | token u32, length u64, remote address u64, rkey length u16, rkey  | no             |
//	| ATS    | token u32                                                         | no             |
//	| FIN    | empty                                                             | no             |
//	| RST    | code u32 (reset codes below)                                      | no             |
//
// A writer starts with initialCredit bytes of credit; on Start the receiver
// grants the rest of its window with a CREDIT. A message for an unknown conn
// id is dropped; a malformed message, or DATA beyond the granted window,
// resets that conn. Rendezvous data (RTS) is not credit-counted: the reader
// pulls it into its own buffers, so it cannot overrun the receiver.
const (
	hdrLen        = 8
	rtsFixedLen   = 4 + 8 + 8 + 2
	atsLen        = 4
	rstLen        = 4
	maxRKeyLen    = 1024
	initialCredit = 64 << 10
)

// Reset codes carried by RST.
const (
	rstAbort     uint32 = 1 // the application aborted the conn (Abort)
	rstProtocol  uint32 = 2 // the peer sent a malformed or out-of-window message
	rstRndv      uint32 = 3 // a rendezvous pull failed
	rstMuxClosed uint32 = 4 // the peer's Mux closed
	rstWriteAbrt uint32 = 5 // a Write was abandoned during rendezvous (deadline, close)
)

func rstCodeString(code uint32) string {
	switch code {
	case rstAbort:
		return "aborted"
	case rstProtocol:
		return "protocol error"
	case rstRndv:
		return "rendezvous failed"
	case rstMuxClosed:
		return "transport closed"
	case rstWriteAbrt:
		return "write abandoned"
	}
	return "unknown code"
}

var errShort = errors.New("message too short")

// makeHdr is the 64-bit AMShort header: conn id in the low half, credit in the high.
func makeHdr(conn, credit uint32) uint64 { return uint64(conn) | uint64(credit)<<32 }

// parseHdr splits an incoming message into conn id, credit and body.
func parseHdr(data []byte) (conn, credit uint32, body []byte, ok bool) {
	if len(data) < hdrLen {
		return 0, 0, nil, false
	}
	return binary.LittleEndian.Uint32(data), binary.LittleEndian.Uint32(data[4:]), data[hdrLen:], true
}

// rts is a decoded rendezvous request.
type rts struct {
	token  uint32
	length uint64
	addr   uint64
	rkey   []byte // aliases the message: copy before the handler returns
}

// putRTS encodes an RTS body into b (len(b) >= rtsFixedLen+len(rkey)) and returns its length.
func putRTS(b []byte, token uint32, length, addr uint64, rkey []byte) int {
	binary.LittleEndian.PutUint32(b, token)
	binary.LittleEndian.PutUint64(b[4:], length)
	binary.LittleEndian.PutUint64(b[12:], addr)
	binary.LittleEndian.PutUint16(b[20:], uint16(len(rkey)))
	return rtsFixedLen + copy(b[rtsFixedLen:], rkey)
}

func parseRTS(body []byte) (rts, error) {
	if len(body) < rtsFixedLen {
		return rts{}, errShort
	}
	r := rts{
		token:  binary.LittleEndian.Uint32(body),
		length: binary.LittleEndian.Uint64(body[4:]),
		addr:   binary.LittleEndian.Uint64(body[12:]),
	}
	n := int(binary.LittleEndian.Uint16(body[20:]))
	if n > maxRKeyLen || len(body) != rtsFixedLen+n {
		return rts{}, errors.New("bad rkey length")
	}
	if r.length == 0 || r.length > 1<<48 || r.addr+r.length < r.addr {
		return rts{}, errors.New("bad rendezvous length")
	}
	r.rkey = body[rtsFixedLen:]
	return r, nil
}

func parseU32(body []byte) (uint32, bool) {
	if len(body) != 4 {
		return 0, false
	}
	return binary.LittleEndian.Uint32(body), true
}
