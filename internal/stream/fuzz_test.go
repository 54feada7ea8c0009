package stream

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/gouct/gouct/uct"
)

// FuzzDecode: the decoders never panic, accept only what they can use, and
// an encoded RTS decodes to what was encoded.
func FuzzDecode(f *testing.F) {
	rts := make([]byte, 64)
	n := putRTS(rts, 7, 1<<20, 0x7f0000001000, []byte{1, 2, 3, 4, 5, 6, 7, 8})
	f.Add(rts[:n])
	f.Add([]byte{})
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add(make([]byte, rtsFixedLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		if conn, credit, body, ok := parseHdr(b); ok {
			if len(body) != len(b)-hdrLen || conn != binary.LittleEndian.Uint32(b) || credit != binary.LittleEndian.Uint32(b[4:]) {
				t.Fatal("header decode")
			}
		} else if len(b) >= hdrLen {
			t.Fatal("header refused")
		}
		if r, err := parseRTS(b); err == nil {
			if r.length == 0 || len(r.rkey) > maxRKeyLen {
				t.Fatalf("accepted bad RTS %+v", r)
			}
			out := make([]byte, rtsFixedLen+len(r.rkey))
			if k := putRTS(out, r.token, r.length, r.addr, r.rkey); !bytes.Equal(out[:k], b) {
				t.Fatal("RTS does not round-trip")
			}
		}
		parseU32(b)
	})
}

// FuzzHandlers delivers arbitrary messages, through a real endpoint, to a
// live conn: the Mux must never panic; the conn either keeps working or is
// reset (a protocol error), and another conn of the same Mux is unaffected.
func FuzzHandlers(f *testing.F) {
	f.Add(uint8(0), []byte{})
	f.Add(uint8(0), []byte("hello"))
	f.Add(uint8(1), []byte{})
	f.Add(uint8(2), make([]byte, rtsFixedLen+8))
	f.Add(uint8(3), []byte{1, 0, 0, 0})
	f.Add(uint8(4), []byte{})
	f.Add(uint8(5), []byte{2, 0, 0, 0})
	f.Add(uint8(200), []byte{0xff})
	e := newEnv(f, "self", nil)
	raw, _, err := connectEPs(e.a, e.b)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { raw.Close() })
	bystander := e.pair(f)
	f.Cleanup(bystander.close)
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		victim := e.pair(t)
		defer victim.close()
		am := amData + which%6
		hdr := make([]byte, hdrLen, hdrLen+len(body))
		id := victim.c2.ID()
		if which >= 128 {
			id ^= uint32(which) << 8 // someone else's id: dropped
		}
		binary.LittleEndian.PutUint32(hdr, id)
		binary.LittleEndian.PutUint32(hdr[4:], uint32(len(body))*977)
		msg := append(hdr, body...)
		if len(msg) > e.a.ti.Attr.MaxBcopy {
			msg = msg[:e.a.ti.Attr.MaxBcopy]
		}
		for {
			_, err := raw.AMBcopy(am, func(b []byte) int { return copy(b, msg) })
			if err == nil {
				break
			}
			if !errors.Is(err, uct.ErrNoResource) {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Microsecond)
		}
		// The victim either works or was reset by the protocol check.
		go victim.c1.Write([]byte("ping"))
		victim.c2.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 64)
		_, err := io.ReadAtLeast(victim.c2, buf, 1)
		if err != nil && !errors.Is(err, ErrProtocol) && !errors.Is(err, ErrReset) && err != io.EOF {
			t.Fatalf("victim after %d-byte message on AM %d: %v", len(msg), am, err)
		}
		go bystander.c1.Write([]byte("ok"))
		bystander.c2.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := io.ReadFull(bystander.c2, buf[:2]); err != nil || string(buf[:2]) != "ok" {
			t.Fatalf("bystander: %q %v", buf[:2], err)
		}
	})
}
