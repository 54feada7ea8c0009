package wire

import (
	"bytes"
	"reflect"
	"testing"
)

// The fuzz targets decode arbitrary frames: decoding must never panic, and
// whatever decodes must re-encode to the same bytes. Their seed corpus is in
// testdata/fuzz and runs with every `go test`.

func FuzzHello(f *testing.F) {
	if b, err := AppendHello(nil, sampleHello()); err == nil {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		h, err := DecodeHello(frame)
		if err != nil {
			return
		}
		out, err := AppendHello(nil, &h)
		if err != nil {
			t.Fatalf("re-encode %+v: %v", h, err)
		}
		if !bytes.Equal(out, frame) {
			t.Fatalf("re-encoded %x, decoded from %x", out, frame)
		}
		h2, err := DecodeHello(out)
		if err != nil || !reflect.DeepEqual(h, h2) {
			t.Fatalf("second decode %+v, %v; first %+v", h2, err, h)
		}
	})
}

func FuzzReply(f *testing.F) {
	if b, err := AppendReply(nil, &Reply{Status: StatusOK, Choice: 1, ConnID: 3, IfaceAddr: []byte{1, 2}}); err == nil {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		r, err := DecodeReply(frame)
		if err != nil {
			return
		}
		out, err := AppendReply(nil, &r)
		if err != nil {
			t.Fatalf("re-encode %+v: %v", r, err)
		}
		if !bytes.Equal(out, frame) {
			t.Fatalf("re-encoded %x, decoded from %x", out, frame)
		}
	})
}

func FuzzReady(f *testing.F) {
	if b, err := AppendReady(nil, &Ready{}); err == nil {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		r, err := DecodeReady(frame)
		if err != nil {
			return
		}
		out, err := AppendReady(nil, &r)
		if err != nil {
			t.Fatalf("re-encode %+v: %v", r, err)
		}
		if !bytes.Equal(out, frame) {
			t.Fatalf("re-encoded %x, decoded from %x", out, frame)
		}
	})
}

// FuzzReadFrame feeds arbitrary streams to the socket reader.
func FuzzReadFrame(f *testing.F) {
	if b, err := AppendHello(nil, sampleHello()); err == nil {
		f.Add(b, uint8(TypeHello))
	}
	f.Fuzz(func(t *testing.T, stream []byte, typ uint8) {
		fr, err := ReadFrame(bytes.NewReader(stream), Type(typ), make([]byte, 16))
		if err != nil {
			return
		}
		if len(fr) > MaxFrame || !bytes.HasPrefix(stream, fr) {
			t.Fatalf("frame %x not a bounded prefix of %x", fr, stream)
		}
	})
}
