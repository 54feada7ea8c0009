// Package wire holds the codecs of the wireup handshake that runs on the
// bootstrap TCP socket before a connection switches to a UCT transport
// (DESIGN.md "Wireup"): Hello (client → server), Reply (server → client) and
// Ready (both ways).
//
// The codecs are pure functions over byte slices: they never panic on peer
// data, bound every length, and report malformed input with errors wrapping
// the sentinels below. They are not on a hot path (one handshake per
// connection) and may allocate.
//
// # Frame
//
// Every message is one frame; all integers are big endian.
//
//	| offset | size | field                                            |
//	|--------|------|--------------------------------------------------|
//	| 0      | 4    | magic "rdmn"                                     |
//	| 4      | 1    | version (1)                                      |
//	| 5      | 1    | type: 1 Hello, 2 Reply, 3 Ready                  |
//	| 6      | 2    | body length n, at most MaxBody (4096)            |
//	| 8      | n    | body                                             |
//
// Strings and byte fields in bodies are "str8": a 1-byte length then that
// many bytes (so at most 255). A body must be consumed exactly: trailing
// bytes are an error.
//
// # Hello body (client → server)
//
//	| size   | field                                                     |
//	|--------|-----------------------------------------------------------|
//	| 16     | boot id of the client's host (/proc/sys/kernel/random/boot_id) |
//	| 4      | uid of the client process                                 |
//	| 4      | pid of the client process                                 |
//	| 1      | flags: bit 0 TCP fallback allowed, bit 1 forced list      |
//	| str8   | transports the client asked for (RDMANET_TLS), for errors |
//	| 1      | candidate count c, at most MaxCandidates (16)             |
//	| c ×    | candidate:                                                |
//	|  str8  |   transport name ("shm", "rc_verbs")                      |
//	|  str8  |   device name ("memory", "rxe0:1")                        |
//	|  str8  |   device address                                          |
//	|  str8  |   iface address                                           |
//	|  str8  |   EP address (connect-to-EP transports; else empty)       |
//	|  8     |   capability flags (uct.Capability)                       |
//	|  4     |   client conn id on this transport                        |
//
// # Reply body (server → client)
//
//	| size | field                                                     |
//	|------|-----------------------------------------------------------|
//	| 1    | status: 0 OK, 1 TCP fallback, 2 refused                   |
//	| 1    | reason code (Reason*; 0 with status OK)                   |
//	| 1    | index of the chosen candidate (status OK)                 |
//	| 4    | server conn id (status OK)                                |
//	| str8 | server device address                                     |
//	| str8 | server iface address                                      |
//	| str8 | server EP address (connect-to-EP transports)              |
//	| str8 | transports the server offers, for errors                  |
//	| str8 | detail: human readable, for errors and logs               |
//
// # Ready body (client → server, then server → client)
//
//	| size | field                                                     |
//	|------|-----------------------------------------------------------|
//	| 1    | status: 0 OK, 1 TCP fallback, 2 refused                   |
//	| 1    | reason code                                               |
//	| str8 | detail                                                    |
//
// After a Reply or Ready with status "TCP fallback" nothing more is framed:
// the socket carries the application's bytes as is.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Constants of the format.
const (
	Magic         = "rdmn"
	Version       = 1
	HeaderLen     = 8
	MaxBody       = 4096
	MaxFrame      = HeaderLen + MaxBody
	MaxCandidates = 16
	MaxStr        = 255
)

// Errors. Every decoding error wraps one of them.
var (
	ErrBadMagic  = errors.New("wire: bad magic (not an rdmanet peer)")
	ErrVersion   = errors.New("wire: unsupported version")
	ErrType      = errors.New("wire: unexpected message type")
	ErrTooLarge  = errors.New("wire: message too large")
	ErrTruncated = errors.New("wire: truncated message")
	ErrMalformed = errors.New("wire: malformed message")
)

// Type is a message type.
type Type uint8

// Message types.
const (
	TypeHello Type = 1
	TypeReply Type = 2
	TypeReady Type = 3
)

func (t Type) String() string {
	switch t {
	case TypeHello:
		return "hello"
	case TypeReply:
		return "reply"
	case TypeReady:
		return "ready"
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// Status of a Reply or Ready.
type Status uint8

// Statuses.
const (
	StatusOK       Status = 0 // use the chosen transport
	StatusFallback Status = 1 // the bootstrap socket is the connection
	StatusRefused  Status = 2 // no connection
)

func (s Status) String() string {
	switch s {
	case StatusOK:
		return "ok"
	case StatusFallback:
		return "tcp fallback"
	case StatusRefused:
		return "refused"
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// Reason says why a connection fell back to TCP or was refused (SMC-R's
// decline codes play the same role).
type Reason uint8

// Reason codes.
const (
	ReasonNone         Reason = 0
	ReasonNoCommon     Reason = 1 // no transport both sides allow
	ReasonOtherHost    Reason = 2 // host-local transports only, peer on another host or user
	ReasonUnreachable  Reason = 3 // common transports, but the peer's device is unreachable
	ReasonDisabled     Reason = 4 // disabled by configuration (RDMANET_TLS)
	ReasonConnectError Reason = 5 // creating or connecting the endpoint failed
	ReasonVersion      Reason = 6 // the peer speaks another wire version
	ReasonInternal     Reason = 7 // local failure (e.g. out of connection ids)
	ReasonFailed       Reason = 8 // the transport failed for good (RDMA device removed, fatal error)
)

var reasonText = [...]string{
	ReasonNone:         "none",
	ReasonNoCommon:     "no common transport",
	ReasonOtherHost:    "peer on another host or user",
	ReasonUnreachable:  "peer device unreachable",
	ReasonDisabled:     "disabled by config",
	ReasonConnectError: "connect error",
	ReasonVersion:      "wire version mismatch",
	ReasonInternal:     "internal error",
	ReasonFailed:       "transport failed",
}

func (r Reason) String() string {
	if int(r) < len(reasonText) {
		return reasonText[r]
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// Header is a decoded frame header.
type Header struct {
	Version uint8
	Type    Type
	Len     int // body length
}

// ParseHeader decodes a frame header from the first HeaderLen bytes of b.
// A version other than Version is reported with the header filled in and an
// error wrapping ErrVersion, so the caller can answer in its own version.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderLen {
		return Header{}, fmt.Errorf("header of %d bytes: %w", len(b), ErrTruncated)
	}
	if string(b[:4]) != Magic {
		return Header{}, fmt.Errorf("%w: %q", ErrBadMagic, b[:4])
	}
	h := Header{Version: b[4], Type: Type(b[5]), Len: int(binary.BigEndian.Uint16(b[6:8]))}
	if h.Version != Version {
		return h, fmt.Errorf("%w: peer speaks version %d, this side %d", ErrVersion, h.Version, Version)
	}
	if h.Type < TypeHello || h.Type > TypeReady {
		return h, fmt.Errorf("%w: %v", ErrType, h.Type)
	}
	if h.Len > MaxBody {
		return h, fmt.Errorf("%v body of %d bytes (max %d): %w", h.Type, h.Len, MaxBody, ErrTooLarge)
	}
	return h, nil
}

// ReadFrame reads one frame of type want from r into buf (which should have
// room for MaxFrame bytes; it grows otherwise) and returns the whole frame.
// It reads exactly the frame and nothing past it, so the socket can carry
// other bytes afterwards. Deadlines are the caller's (set them on r).
func ReadFrame(r io.Reader, want Type, buf []byte) ([]byte, error) {
	if cap(buf) < MaxFrame {
		buf = make([]byte, MaxFrame)
	}
	buf = buf[:HeaderLen]
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, fmt.Errorf("read %v header: %w", want, noEOF(err))
	}
	h, err := ParseHeader(buf)
	if err != nil {
		return buf, err
	}
	if h.Type != want {
		return nil, fmt.Errorf("%w: got %v, want %v", ErrType, h.Type, want)
	}
	buf = buf[:HeaderLen+h.Len]
	if _, err := io.ReadFull(r, buf[HeaderLen:]); err != nil {
		return nil, fmt.Errorf("read %v body (%d bytes): %w", want, h.Len, noEOF(err))
	}
	return buf, nil
}

// noEOF turns a clean EOF inside a frame into ErrTruncated (with the EOF kept
// for errors.Is); other errors pass through.
func noEOF(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w (%w)", ErrTruncated, err)
	}
	return err
}

// body checks a frame's header against want and returns its body.
func body(frame []byte, want Type) ([]byte, error) {
	h, err := ParseHeader(frame)
	if err != nil {
		return nil, err
	}
	if h.Type != want {
		return nil, fmt.Errorf("%w: got %v, want %v", ErrType, h.Type, want)
	}
	if len(frame)-HeaderLen < h.Len {
		return nil, fmt.Errorf("%v body: %d of %d bytes: %w", want, len(frame)-HeaderLen, h.Len, ErrTruncated)
	}
	if len(frame)-HeaderLen > h.Len {
		return nil, fmt.Errorf("%v: %d bytes after the frame: %w", want, len(frame)-HeaderLen-h.Len, ErrMalformed)
	}
	return frame[HeaderLen:], nil
}

// encoder appends to a frame; the first error sticks.
type encoder struct {
	b   []byte
	err error
}

func newEncoder(dst []byte, t Type) *encoder {
	e := &encoder{b: append(dst, Magic...)}
	e.b = append(e.b, Version, byte(t), 0, 0)
	return e
}

func (e *encoder) u8(v uint8)   { e.b = append(e.b, v) }
func (e *encoder) u32(v uint32) { e.b = binary.BigEndian.AppendUint32(e.b, v) }
func (e *encoder) u64(v uint64) { e.b = binary.BigEndian.AppendUint64(e.b, v) }

func (e *encoder) str(name string, s []byte) {
	if len(s) > MaxStr {
		if e.err == nil {
			e.err = fmt.Errorf("%s of %d bytes (max %d): %w", name, len(s), MaxStr, ErrTooLarge)
		}
		return
	}
	e.b = append(e.b, byte(len(s)))
	e.b = append(e.b, s...)
}

// finish fills the body length of the frame that starts at start.
func (e *encoder) finish(start int) ([]byte, error) {
	if e.err != nil {
		return nil, e.err
	}
	n := len(e.b) - start - HeaderLen
	if n > MaxBody {
		return nil, fmt.Errorf("body of %d bytes (max %d): %w", n, MaxBody, ErrTooLarge)
	}
	binary.BigEndian.PutUint16(e.b[start+6:], uint16(n))
	return e.b, nil
}

// decoder reads a body; the first error sticks and later reads return zeros.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) need(n int, what string) bool {
	if d.err != nil {
		return false
	}
	if len(d.b) < n {
		d.err = fmt.Errorf("%s: %w", what, ErrTruncated)
		return false
	}
	return true
}

func (d *decoder) u8(what string) uint8 {
	if !d.need(1, what) {
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) u32(what string) uint32 {
	if !d.need(4, what) {
		return 0
	}
	v := binary.BigEndian.Uint32(d.b)
	d.b = d.b[4:]
	return v
}

func (d *decoder) u64(what string) uint64 {
	if !d.need(8, what) {
		return 0
	}
	v := binary.BigEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

// bytes returns a copy (nil when empty) so the result does not alias the frame buffer.
func (d *decoder) bytes(what string) []byte {
	n := int(d.u8(what))
	if !d.need(n, what) {
		return nil
	}
	var v []byte
	if n > 0 {
		v = append([]byte(nil), d.b[:n]...)
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) str(what string) string { return string(d.bytes(what)) }

func (d *decoder) done(t Type) error {
	if d.err != nil {
		return fmt.Errorf("decode %v: %w", t, d.err)
	}
	if len(d.b) != 0 {
		return fmt.Errorf("decode %v: %d trailing bytes: %w", t, len(d.b), ErrMalformed)
	}
	return nil
}
