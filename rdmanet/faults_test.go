package rdmanet_test

import (
	"bytes"
	"io"
	"testing"
	"time"

	"github.com/gouct/gouct/rdmanet"
)

// childRoles are the extra peer roles of fault tests (see childMain).
var childRoles = map[string]func(){}

// TestWriteRightAfterHandshake: a rendezvous-sized Write the moment Accept
// (or Dial) returns reaches a peer whose handshake may still be finishing;
// it must arrive intact (it used to reach a conn not yet started, whose
// puller had no endpoint: nil dereference).
func TestWriteRightAfterHandshake(t *testing.T) {
	msg := make([]byte, 1<<20)
	streamBytes(42).Read(msg)
	for _, tl := range []string{"self", "shm"} {
		for _, serverWrites := range []bool{true, false} {
			name := tl + "/client writes"
			if serverWrites {
				name = tl + "/server writes"
			}
			t.Run(name, func(t *testing.T) {
				c := cfg(tl)
				l := listen(t, c)
				defer l.Close()
				got := make(chan []byte, 1)
				go func() {
					for {
						s, err := l.Accept()
						if err != nil {
							return
						}
						go func() {
							defer s.Close()
							if serverWrites {
								s.Write(msg)
								return
							}
							b, _ := io.ReadAll(s)
							got <- b
						}()
					}
				}()
				d := &rdmanet.Dialer{Config: c, Timeout: 10 * time.Second}
				for i := range 30 {
					cl, err := d.Dial("rdma", l.Addr().String())
					if err != nil {
						t.Fatal(err)
					}
					var b []byte
					if serverWrites {
						b, err = io.ReadAll(cl)
					} else {
						_, err = cl.Write(msg)
						cl.Close()
						b = <-got
					}
					cl.Close()
					if err != nil || !bytes.Equal(b, msg) {
						t.Fatalf("round %d: got %d bytes (equal %v), %v", i, len(b), bytes.Equal(b, msg), err)
					}
				}
			})
		}
	}
}
