// Command client is the grpc-over-rdma example client: the only change from a
// plain gRPC client is the dialer option (dialer.GRPC()).
//
//	client -addr 127.0.0.1:50051 [-tcp-addr 127.0.0.1:50052] [-tls] [-transport shm]
//
// It makes unary and server-streaming calls, prints the transport of its
// connection, the unary latency p50/p99 and the streaming throughput, and,
// with -tcp-addr, the same calls over plain TCP beside them.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/gouct/gouct/dialer"
	pb "github.com/gouct/gouct/examples/grpc-over-rdma/echopb"
	"github.com/gouct/gouct/examples/grpc-over-rdma/internal/certs"
	"github.com/gouct/gouct/rdmanet"
)

type result struct {
	transport     string // as the server saw it
	local         string // as the client's dialer saw it
	p50, p99      time.Duration
	streamBytesPS float64
}

func main() {
	addr := flag.String("addr", "127.0.0.1:50051", "server's rdmanet address")
	tcpAddr := flag.String("tcp-addr", "", "server's plain TCP address: run the same calls there as a baseline")
	useTLS := flag.Bool("tls", false, "use TLS, trusting the certificate the server wrote to -cert")
	certPath := flag.String("cert", os.TempDir()+"/grpc-over-rdma-cert.pem", "server certificate (with -tls)")
	transport := flag.String("transport", "", "force transports (sets RDMANET_TLS, e.g. shm, tcp, rc_verbs)")
	calls := flag.Int("n", 5000, "unary calls")
	size := flag.Int("size", 1024, "unary payload bytes")
	streamBytes := flag.Int64("stream-bytes", 512<<20, "bytes the server streams back")
	chunk := flag.Int("chunk", 1<<20, "streaming chunk bytes")
	baselineOnly := flag.Bool("baseline-only", false, "run only the plain TCP calls at -tcp-addr (to profile the baseline alone)")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("client: ")
	if *transport != "" {
		os.Setenv("RDMANET_TLS", *transport)
	}
	creds := insecure.NewCredentials()
	if *useTLS {
		cfg, err := certs.ClientConfig(*certPath)
		if err != nil {
			log.Fatal(err)
		}
		creds = credentials.NewTLS(cfg)
	}

	tcpDial := grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", a)
	})
	if *baselineOnly {
		if *tcpAddr == "" {
			log.Fatal("-baseline-only needs -tcp-addr")
		}
		b, err := bench(*tcpAddr, creds, tcpDial, *calls, *size, *streamBytes, *chunk)
		if err != nil {
			log.Fatalf("tcp baseline: %v", err)
		}
		printTable("grpc over tcp", b, nil, *size, *chunk)
		return
	}
	var seen atomic.Value
	rdmaDial := func(ctx context.Context, a string) (net.Conn, error) {
		c, err := dialer.GRPC()(ctx, a)
		if err == nil {
			if rc, ok := c.(rdmanet.Conn); ok {
				seen.Store(rc.Transport())
			}
		}
		return c, err
	}
	r, err := bench(*addr, creds, grpc.WithContextDialer(rdmaDial), *calls, *size, *streamBytes, *chunk)
	if err != nil {
		log.Fatalf("rdmanet: %v", err)
	}
	if t, ok := seen.Load().(string); ok {
		r.local = t
	}
	fmt.Printf("connection to %s: transport %s (server side: %s)\n", *addr, r.local, r.transport)
	var base *result
	if *tcpAddr != "" {
		b, err := bench(*tcpAddr, creds, tcpDial, *calls, *size, *streamBytes, *chunk)
		if err != nil {
			log.Fatalf("tcp baseline: %v", err)
		}
		base = &b
	}
	printTable("rdmanet ("+r.local+")", r, base, *size, *chunk)
}

func bench(addr string, creds credentials.TransportCredentials, dial grpc.DialOption, calls, size int, streamBytes int64, chunk int) (result, error) {
	cc, err := grpc.NewClient("passthrough:///"+addr, dial, grpc.WithTransportCredentials(creds),
		grpc.WithWriteBufferSize(1<<20), grpc.WithReadBufferSize(1<<20),
		grpc.WithInitialWindowSize(16<<20), grpc.WithInitialConnWindowSize(16<<20),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(8<<20)))
	if err != nil {
		return result{}, err
	}
	defer cc.Close()
	c := pb.NewEchoClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	payload := make([]byte, size)
	var res result
	lat := make([]time.Duration, 0, calls)
	for i := 0; i < calls+calls/10; i++ { // the first tenth warms up
		t0 := time.Now()
		rep, err := c.Echo(ctx, &pb.EchoRequest{Payload: payload})
		if err != nil {
			return res, err
		}
		if len(rep.Payload) != size {
			return res, fmt.Errorf("echo returned %d bytes, want %d", len(rep.Payload), size)
		}
		if i >= calls/10 {
			lat = append(lat, time.Since(t0))
		}
		res.transport = rep.Transport
	}
	slices.Sort(lat)
	res.p50, res.p99 = lat[len(lat)/2], lat[len(lat)*99/100]

	t0 := time.Now()
	st, err := c.Stream(ctx, &pb.StreamRequest{ChunkSize: int32(chunk), TotalBytes: streamBytes})
	if err != nil {
		return res, err
	}
	var got int64
	for {
		m, err := st.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return res, err
		}
		got += int64(len(m.Data))
	}
	if got != streamBytes {
		return res, fmt.Errorf("stream returned %d bytes, want %d", got, streamBytes)
	}
	res.streamBytesPS = float64(got) / time.Since(t0).Seconds()
	return res, nil
}

func printTable(name string, r result, base *result, size, chunk int) {
	us := func(d time.Duration) string { return fmt.Sprintf("%.1f µs", float64(d)/1e3) }
	mbs := func(v float64) string { return fmt.Sprintf("%.0f MB/s", v/1e6) }
	if base == nil {
		fmt.Printf("%-28s %16s\n", "", name)
		fmt.Printf("%-28s %16s\n", fmt.Sprintf("unary %d B p50", size), us(r.p50))
		fmt.Printf("%-28s %16s\n", fmt.Sprintf("unary %d B p99", size), us(r.p99))
		fmt.Printf("%-28s %16s\n", fmt.Sprintf("stream %d KiB chunks", chunk>>10), mbs(r.streamBytesPS))
		return
	}
	fmt.Printf("%-28s %16s %16s %8s\n", "", name, "grpc over tcp", "ratio")
	fmt.Printf("%-28s %16s %16s %8.2f\n", fmt.Sprintf("unary %d B p50", size), us(r.p50), us(base.p50), float64(r.p50)/float64(base.p50))
	fmt.Printf("%-28s %16s %16s %8.2f\n", fmt.Sprintf("unary %d B p99", size), us(r.p99), us(base.p99), float64(r.p99)/float64(base.p99))
	fmt.Printf("%-28s %16s %16s %8.2f\n", fmt.Sprintf("stream %d KiB chunks", chunk>>10), mbs(r.streamBytesPS), mbs(base.streamBytesPS), r.streamBytesPS/base.streamBytesPS)
}
