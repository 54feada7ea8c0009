package wire

import (
	"bytes"
	"fmt"
)

// HostID identifies "same host, same user": the kernel boot id and the uid.
type HostID struct {
	BootID [16]byte
	UID    uint32
}

// Hello flags.
const (
	FlagTCPAllowed uint8 = 1 << 0 // the client accepts the raw TCP fallback
	FlagForced     uint8 = 1 << 1 // the client's transport list is forced (RDMANET_TLS)
	flagsKnown           = FlagTCPAllowed | FlagForced
)

// Candidate is one transport the client offers, with what the server needs
// to reach it.
type Candidate struct {
	TL, Device string
	DevAddr    []byte
	IfaceAddr  []byte
	EPAddr     []byte // connect-to-EP transports: the client's unconnected EP
	Cap        uint64 // uct.Capability of the client's iface
	ConnID     uint32 // the client's stream conn id on this transport
}

// Hello is the client's first message.
type Hello struct {
	Host  HostID
	PID   uint32
	Flags uint8
	Asked string // the client's transport list, quoted in errors
	Cands []Candidate
}

// AppendHello appends h as a frame to dst.
func AppendHello(dst []byte, h *Hello) ([]byte, error) {
	if len(h.Cands) > MaxCandidates {
		return nil, fmt.Errorf("hello with %d candidates (max %d): %w", len(h.Cands), MaxCandidates, ErrTooLarge)
	}
	start := len(dst)
	e := newEncoder(dst, TypeHello)
	e.b = append(e.b, h.Host.BootID[:]...)
	e.u32(h.Host.UID)
	e.u32(h.PID)
	e.u8(h.Flags)
	e.str("asked", []byte(h.Asked))
	e.u8(uint8(len(h.Cands)))
	for i := range h.Cands {
		c := &h.Cands[i]
		e.str("transport", []byte(c.TL))
		e.str("device", []byte(c.Device))
		e.str("device address", c.DevAddr)
		e.str("iface address", c.IfaceAddr)
		e.str("ep address", c.EPAddr)
		e.u64(c.Cap)
		e.u32(c.ConnID)
	}
	return e.finish(start)
}

// DecodeHello decodes a whole Hello frame (header included).
func DecodeHello(frame []byte) (Hello, error) {
	var h Hello
	b, err := body(frame, TypeHello)
	if err != nil {
		return h, err
	}
	d := &decoder{b: b}
	if d.need(16, "boot id") {
		copy(h.Host.BootID[:], d.b)
		d.b = d.b[16:]
	}
	h.Host.UID = d.u32("uid")
	h.PID = d.u32("pid")
	h.Flags = d.u8("flags")
	h.Asked = d.str("asked")
	n := int(d.u8("candidate count"))
	if d.err == nil && h.Flags&^flagsKnown != 0 {
		d.err = fmt.Errorf("unknown flags %#x: %w", h.Flags&^flagsKnown, ErrMalformed)
	}
	if d.err == nil && n > MaxCandidates {
		d.err = fmt.Errorf("%d candidates (max %d): %w", n, MaxCandidates, ErrTooLarge)
	}
	if d.err == nil && n > 0 {
		h.Cands = make([]Candidate, 0, n)
	}
	for i := 0; i < n && d.err == nil; i++ {
		var c Candidate
		c.TL = d.str("transport")
		c.Device = d.str("device")
		c.DevAddr = d.bytes("device address")
		c.IfaceAddr = d.bytes("iface address")
		c.EPAddr = d.bytes("ep address")
		c.Cap = d.u64("capabilities")
		c.ConnID = d.u32("conn id")
		if d.err == nil && c.TL == "" {
			d.err = fmt.Errorf("candidate %d without transport name: %w", i, ErrMalformed)
		}
		h.Cands = append(h.Cands, c)
	}
	return h, d.done(TypeHello)
}

// Reply is the server's answer to a Hello.
type Reply struct {
	Status    Status
	Reason    Reason
	Choice    uint8  // index into Hello.Cands (StatusOK)
	ConnID    uint32 // the server's stream conn id (StatusOK)
	DevAddr   []byte
	IfaceAddr []byte
	EPAddr    []byte
	Offered   string // the server's transports, quoted in errors
	Detail    string
}

// AppendReply appends r as a frame to dst.
func AppendReply(dst []byte, r *Reply) ([]byte, error) {
	start := len(dst)
	e := newEncoder(dst, TypeReply)
	e.u8(uint8(r.Status))
	e.u8(uint8(r.Reason))
	e.u8(r.Choice)
	e.u32(r.ConnID)
	e.str("device address", r.DevAddr)
	e.str("iface address", r.IfaceAddr)
	e.str("ep address", r.EPAddr)
	e.str("offered", []byte(truncate(r.Offered)))
	e.str("detail", []byte(truncate(r.Detail)))
	return e.finish(start)
}

// DecodeReply decodes a whole Reply frame.
func DecodeReply(frame []byte) (Reply, error) {
	var r Reply
	b, err := body(frame, TypeReply)
	if err != nil {
		return r, err
	}
	d := &decoder{b: b}
	r.Status = Status(d.u8("status"))
	r.Reason = Reason(d.u8("reason"))
	r.Choice = d.u8("choice")
	r.ConnID = d.u32("conn id")
	r.DevAddr = d.bytes("device address")
	r.IfaceAddr = d.bytes("iface address")
	r.EPAddr = d.bytes("ep address")
	r.Offered = d.str("offered")
	r.Detail = d.str("detail")
	if d.err == nil {
		d.err = checkStatus(r.Status, r.Reason)
	}
	if d.err == nil && r.Status == StatusOK && int(r.Choice) >= MaxCandidates {
		d.err = fmt.Errorf("choice %d: %w", r.Choice, ErrMalformed)
	}
	return r, d.done(TypeReply)
}

// Ready closes the handshake.
type Ready struct {
	Status Status
	Reason Reason
	Detail string
}

// AppendReady appends r as a frame to dst.
func AppendReady(dst []byte, r *Ready) ([]byte, error) {
	start := len(dst)
	e := newEncoder(dst, TypeReady)
	e.u8(uint8(r.Status))
	e.u8(uint8(r.Reason))
	e.str("detail", []byte(truncate(r.Detail)))
	return e.finish(start)
}

// DecodeReady decodes a whole Ready frame.
func DecodeReady(frame []byte) (Ready, error) {
	var r Ready
	b, err := body(frame, TypeReady)
	if err != nil {
		return r, err
	}
	d := &decoder{b: b}
	r.Status = Status(d.u8("status"))
	r.Reason = Reason(d.u8("reason"))
	r.Detail = d.str("detail")
	if d.err == nil {
		d.err = checkStatus(r.Status, r.Reason)
	}
	return r, d.done(TypeReady)
}

func checkStatus(s Status, r Reason) error {
	if s > StatusRefused {
		return fmt.Errorf("status %d: %w", s, ErrMalformed)
	}
	if int(r) >= len(reasonText) {
		return fmt.Errorf("reason %d: %w", r, ErrMalformed)
	}
	if (s == StatusOK) != (r == ReasonNone) {
		return fmt.Errorf("status %v with reason %v: %w", s, r, ErrMalformed)
	}
	return nil
}

// truncate cuts informational text to what a str8 field holds.
func truncate(s string) string {
	if len(s) > MaxStr {
		return s[:MaxStr]
	}
	return s
}

// Equal reports whether two candidates are the same (for tests and lookups).
func (c *Candidate) Equal(o *Candidate) bool {
	return c.TL == o.TL && c.Device == o.Device && bytes.Equal(c.DevAddr, o.DevAddr) &&
		bytes.Equal(c.IfaceAddr, o.IfaceAddr) && bytes.Equal(c.EPAddr, o.EPAddr) &&
		c.Cap == o.Cap && c.ConnID == o.ConnID
}
