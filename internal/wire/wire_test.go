package wire

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
)

func sampleHello() *Hello {
	h := &Hello{PID: 4242, Flags: FlagTCPAllowed, Asked: "all"}
	h.Host.BootID = [16]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	h.Host.UID = 1000
	h.Cands = []Candidate{
		{TL: "self", Device: "memory", DevAddr: []byte{1, 2, 3, 4, 5, 6, 7, 8}, IfaceAddr: []byte{9, 0, 0, 0, 0, 0, 0, 0}, Cap: 0x1ff, ConnID: 7},
		{TL: "rc_verbs", Device: "rxe0:1", DevAddr: bytes.Repeat([]byte{0xfe}, 18), EPAddr: []byte{0, 1, 2}, Cap: 0x5f, ConnID: 1 << 31},
	}
	return h
}

func TestHelloRoundTrip(t *testing.T) {
	h := sampleHello()
	f, err := AppendHello(nil, h)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeHello(f)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&got, h) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, *h)
	}
	// ReadFrame reads exactly one frame and leaves what follows.
	r := bytes.NewReader(append(append([]byte(nil), f...), "rest"...))
	fr, err := ReadFrame(r, TypeHello, nil)
	if err != nil || !bytes.Equal(fr, f) {
		t.Fatalf("ReadFrame = %x, %v", fr, err)
	}
	rest, _ := io.ReadAll(r)
	if string(rest) != "rest" {
		t.Fatalf("ReadFrame over-read: rest %q", rest)
	}
	// One byte at a time works too.
	if _, err := ReadFrame(iotest.OneByteReader(bytes.NewReader(f)), TypeHello, nil); err != nil {
		t.Fatal(err)
	}
}

func TestReplyReadyRoundTrip(t *testing.T) {
	for _, r := range []Reply{
		{Status: StatusOK, Choice: 1, ConnID: 99, DevAddr: []byte{1}, IfaceAddr: []byte{2, 3}, EPAddr: []byte{4, 5, 6}, Offered: "self,shm"},
		{Status: StatusFallback, Reason: ReasonOtherHost, Offered: "shm", Detail: "peer boot id differs"},
		{Status: StatusRefused, Reason: ReasonNoCommon, Offered: strings.Repeat("x", 300)},
	} {
		f, err := AppendReply(nil, &r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeReply(f)
		if err != nil {
			t.Fatal(err)
		}
		r.Offered = truncate(r.Offered)
		if !reflect.DeepEqual(got, r) {
			t.Fatalf("reply round trip:\n got %+v\nwant %+v", got, r)
		}
	}
	for _, r := range []Ready{{}, {Status: StatusFallback, Reason: ReasonConnectError, Detail: "qp to rtr: timeout"}} {
		f, err := AppendReady(nil, &r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeReady(f)
		if err != nil || got != r {
			t.Fatalf("ready round trip: got %+v, %v; want %+v", got, err, r)
		}
	}
}

func TestDecodeErrors(t *testing.T) {
	good, err := AppendHello(nil, sampleHello())
	if err != nil {
		t.Fatal(err)
	}
	mod := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	cases := []struct {
		name  string
		frame []byte
		want  error
	}{
		{"empty", nil, ErrTruncated},
		{"magic", mod(func(b []byte) []byte { b[0] = 'X'; return b }), ErrBadMagic},
		{"http", []byte("GET / HTTP/1.1\r\n\r\n"), ErrBadMagic},
		{"version", mod(func(b []byte) []byte { b[4] = 2; return b }), ErrVersion},
		{"type", mod(func(b []byte) []byte { b[5] = 9; return b }), ErrType},
		{"wrong type", mod(func(b []byte) []byte { b[5] = byte(TypeReady); return b }), ErrType},
		{"huge length", mod(func(b []byte) []byte { b[6], b[7] = 0xff, 0xff; return b }), ErrTooLarge},
		{"truncated body", good[:len(good)-3], ErrTruncated},
		{"trailing", append(append([]byte(nil), good...), 0), ErrMalformed},
		{"short length", mod(func(b []byte) []byte { b[7]--; return b[:len(b)-1] }), ErrTruncated},
		{"flags", mod(func(b []byte) []byte { b[HeaderLen+24] = 0x80; return b }), ErrMalformed},
		{"too many candidates", mod(func(b []byte) []byte { b[HeaderLen+25+1+3] = 200; return b }), ErrTooLarge},
	}
	for _, c := range cases {
		_, err := DecodeHello(c.frame)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
		}
	}
	if _, err := ReadFrame(bytes.NewReader(good[:5]), TypeHello, nil); !errors.Is(err, ErrTruncated) {
		t.Errorf("ReadFrame of a cut header: %v", err)
	}
	if _, err := ReadFrame(bytes.NewReader(good[:20]), TypeHello, nil); !errors.Is(err, ErrTruncated) {
		t.Errorf("ReadFrame of a cut body: %v", err)
	}
	bad := Reply{Status: StatusOK, Reason: ReasonNoCommon}
	f, _ := AppendReply(nil, &bad)
	if _, err := DecodeReply(f); !errors.Is(err, ErrMalformed) {
		t.Errorf("OK with a reason: %v", err)
	}
}

func TestEncodeLimits(t *testing.T) {
	h := sampleHello()
	h.Cands = make([]Candidate, MaxCandidates+1)
	if _, err := AppendHello(nil, h); !errors.Is(err, ErrTooLarge) {
		t.Errorf("too many candidates: %v", err)
	}
	h = sampleHello()
	h.Cands[0].DevAddr = make([]byte, 256)
	if _, err := AppendHello(nil, h); !errors.Is(err, ErrTooLarge) {
		t.Errorf("long address: %v", err)
	}
	// 16 candidates with every field at its maximum exceed MaxBody.
	h = sampleHello()
	h.Cands = make([]Candidate, MaxCandidates)
	for i := range h.Cands {
		h.Cands[i] = Candidate{TL: strings.Repeat("t", 255), DevAddr: make([]byte, 255)}
	}
	if _, err := AppendHello(nil, h); !errors.Is(err, ErrTooLarge) {
		t.Errorf("oversized body: %v", err)
	}
}
