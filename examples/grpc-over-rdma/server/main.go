// Command server is the grpc-over-rdma example server: the only change from a
// plain gRPC server is rdmanet.Listen in place of net.Listen.
//
//	server -addr 127.0.0.1:50051 [-tcp-addr 127.0.0.1:50052] [-tls] [-transport shm]
//
// -tcp-addr also serves the same service over plain TCP, as a baseline.
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	pb "github.com/gouct/gouct/examples/grpc-over-rdma/echopb"
	"github.com/gouct/gouct/examples/grpc-over-rdma/internal/certs"
	"github.com/gouct/gouct/rdmanet"
)

type server struct {
	pb.UnimplementedEchoServer
	transports sync.Map // remote addr -> transport name
}

func (s *server) transportOf(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok {
		if t, ok := s.transports.Load(p.Addr.String()); ok {
			return t.(string)
		}
	}
	return "tcp"
}

func (s *server) Echo(ctx context.Context, req *pb.EchoRequest) (*pb.EchoReply, error) {
	return &pb.EchoReply{Payload: req.Payload, Transport: s.transportOf(ctx)}, nil
}

func (s *server) Stream(req *pb.StreamRequest, st grpc.ServerStreamingServer[pb.Chunk]) error {
	size := int(req.ChunkSize)
	if size <= 0 || size > 4<<20 || req.TotalBytes < 0 {
		return fmt.Errorf("bad request: chunk %d total %d", req.ChunkSize, req.TotalBytes)
	}
	chunk := &pb.Chunk{Data: make([]byte, size)}
	for left := req.TotalBytes; left > 0; left -= int64(size) {
		if left < int64(size) {
			chunk.Data = chunk.Data[:left]
		}
		if err := st.Send(chunk); err != nil {
			return err
		}
	}
	return nil
}

// trackingListener records each accepted conn's transport and logs it.
type trackingListener struct {
	net.Listener
	s *server
}

func (l trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	t := "tcp"
	if rc, ok := c.(rdmanet.Conn); ok {
		t = rc.Transport()
	}
	l.s.transports.Store(c.RemoteAddr().String(), t)
	log.Printf("accepted %s over %s", c.RemoteAddr(), t)
	return c, nil
}

func main() {
	addr := flag.String("addr", "127.0.0.1:50051", "rdmanet listen address (bootstrap TCP host:port)")
	tcpAddr := flag.String("tcp-addr", "", "also serve over plain TCP at this address (baseline)")
	useTLS := flag.Bool("tls", false, "serve TLS with a self-signed certificate generated at start")
	certPath := flag.String("cert", os.TempDir()+"/grpc-over-rdma-cert.pem", "where -tls writes the certificate for the client")
	transport := flag.String("transport", "", "force transports (sets RDMANET_TLS, e.g. shm, tcp, rc_verbs)")
	flag.Parse()
	log.SetFlags(log.Lmicroseconds)
	log.SetPrefix("server: ")
	if *transport != "" {
		os.Setenv("RDMANET_TLS", *transport)
	}
	var opts []grpc.ServerOption
	if *useTLS {
		cert, err := certs.SelfSigned(*certPath)
		if err != nil {
			log.Fatal(err)
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}})))
	}
	s := &server{}
	// Bulk-friendly HTTP/2 settings, the same for the rdmanet and the TCP listener.
	opts = append(opts, grpc.WriteBufferSize(1<<20), grpc.ReadBufferSize(1<<20),
		grpc.InitialWindowSize(16<<20), grpc.InitialConnWindowSize(16<<20))
	gs := grpc.NewServer(opts...)
	pb.RegisterEchoServer(gs, s)

	lis, err := rdmanet.Listen("rdma", *addr) // was: net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		if err := gs.Serve(trackingListener{lis, s}); err != nil {
			log.Print(err)
		}
	}()
	if *tcpAddr != "" {
		tl, err := net.Listen("tcp", *tcpAddr)
		if err != nil {
			log.Fatal(err)
		}
		go gs.Serve(trackingListener{tl, s})
	}
	fmt.Printf("ready rdma=%s tcp=%s\n", lis.Addr(), *tcpAddr)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	<-sig
	gs.Stop()
}
