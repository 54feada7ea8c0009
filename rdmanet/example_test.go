package rdmanet_test

import (
	"context"
	"fmt"
	"io"
	"log"

	"github.com/gouct/gouct/rdmanet"
)

// Listen and Dial as with package net; the conn ends on the best transport
// both ends share (here, inside one process, "self").
func Example() {
	cfg := &rdmanet.Config{TLS: []string{"self", "shm", "tcp"}}
	lc := rdmanet.ListenConfig{Config: cfg}
	l, err := lc.Listen(context.Background(), "rdma", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c) // echo
	}()

	d := rdmanet.Dialer{Config: cfg}
	c, err := d.Dial("rdma", l.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("hello"))
	buf := make([]byte, 5)
	io.ReadFull(c, buf)
	fmt.Println(string(buf), "over", c.(rdmanet.Conn).Transport())
	// Output: hello over self
}
