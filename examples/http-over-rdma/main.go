// Command http-over-rdma serves net/http over rdmanet and fetches from it
// with HTTP/1.1 and HTTP/2 cleartext (h2c), in one process or two:
//
//	http-over-rdma -serve 127.0.0.1:8080     # server only
//	http-over-rdma -get 127.0.0.1:8080       # client only
//	http-over-rdma                           # both, in this process
//
// Server side the swap is one line: srv.Serve(rdmanet.Listen(...)) instead of
// net.Listen; client side, an http.Transport whose DialContext is rdmanet's.
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c"

	"github.com/gouct/gouct/dialer"
	"github.com/gouct/gouct/rdmanet"
)

func handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/hello", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello over %s (%s)\n", r.Context().Value(transportKey{}), r.Proto)
	})
	return h2c.NewHandler(mux, &http2.Server{})
}

type transportKey struct{}

func serve(addr string) (net.Listener, error) {
	lis, err := rdmanet.Listen("rdma", addr) // was: net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: handler(), ConnContext: func(ctx context.Context, c net.Conn) context.Context {
		t := "tcp"
		if rc, ok := c.(rdmanet.Conn); ok {
			t = rc.Transport()
		}
		return context.WithValue(ctx, transportKey{}, t)
	}}
	go srv.Serve(lis)
	return lis, nil
}

func get(addr string) error {
	h1 := &http.Client{Transport: dialer.HTTPTransport()}
	h2 := &http.Client{Transport: &http2.Transport{AllowHTTP: true,
		DialTLSContext: func(ctx context.Context, network, a string, _ *tls.Config) (net.Conn, error) {
			return rdmanet.DialContext(ctx, "rdma", a)
		}}}
	for _, c := range []*http.Client{h1, h2} {
		resp, err := c.Get("http://" + addr + "/hello")
		if err != nil {
			return err
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		fmt.Print(string(b))
	}
	return nil
}

func main() {
	serveAddr := flag.String("serve", "", "serve at this address and wait")
	getAddr := flag.String("get", "", "fetch from a server at this address")
	flag.Parse()
	switch {
	case *serveAddr != "":
		lis, err := serve(*serveAddr)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("serving on", lis.Addr())
		select {}
	case *getAddr != "":
		if err := get(*getAddr); err != nil {
			log.Fatal(err)
		}
	default:
		lis, err := serve("127.0.0.1:0")
		if err != nil {
			log.Fatal(err)
		}
		defer lis.Close()
		if err := get(lis.Addr().String()); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}
