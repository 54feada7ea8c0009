package rdmanet_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/nettest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/gouct/gouct/internal/rt"
	"github.com/gouct/gouct/rdmanet"
)

// rc_verbs at the Conn level, listening on the Soft-RoCE netdev's IP
// (RXE_IP, 10.77.0.1 in scripts/vm-test.sh; 127.0.0.1 elsewhere). Every test
// skips on hosts without an RDMA port and fails in the VM (RXEVM=1).

const rcServerRole = "rcverbs-server"

func init() { childRoles[rcServerRole] = rcVerbsServer }

// rcVerbsConfig forces rc_verbs, or skips (fails under RXEVM=1) without it.
func rcVerbsConfig(t testing.TB) *rdmanet.Config {
	t.Helper()
	c := cfg("rc_verbs")
	resolved, err := rt.Resolve(c)
	if err != nil {
		t.Fatal(err)
	}
	if len(rt.Get(resolved).Allowed(resolved)) == 0 {
		if os.Getenv("RXEVM") == "1" {
			t.Fatalf("RXEVM=1 but no rc_verbs transport: %v", rt.Get(resolved).Skipped)
		}
		t.Skip("no rc_verbs transport on this host")
	}
	return c
}

// rxeIP is the IP of the RDMA netdev the tests listen on.
func rxeIP() string {
	if ip := os.Getenv("RXE_IP"); ip != "" {
		return ip
	}
	return "127.0.0.1"
}

func listenRXE(t testing.TB, c *rdmanet.Config) net.Listener {
	t.Helper()
	lc := rdmanet.ListenConfig{Config: c}
	l, err := lc.Listen(context.Background(), "rdma", net.JoinHostPort(rxeIP(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func wantRC(t testing.TB, c net.Conn) {
	t.Helper()
	if tr := transportOf(t, c); !strings.HasPrefix(tr, "rc_verbs/") {
		t.Errorf("transport %q, want rc_verbs/<dev>", tr)
	}
}

// TestRCVerbsNetIP: nettest.TestConn over rc_verbs, bootstrap on RXE_IP.
func TestRCVerbsNetIP(t *testing.T) {
	c := rcVerbsConfig(t)
	nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) {
		l := listenRXE(t, c)
		c1, c2, err := pipe(l, c)
		if err != nil {
			return nil, nil, nil, err
		}
		wantRC(t, c1)
		wantRC(t, c2)
		return c1, c2, func() { c1.Close(); c2.Close(); l.Close() }, nil
	})
}

// rcVerbsServer is the child of the two-process rc_verbs tests: rdmanet
// echo, gRPC health (plain and TLS) over rc_verbs on RXE_IP, and a Go TCP
// echo on the same IP as the baseline; addresses on the first stdout line;
// it exits when stdin closes.
func rcVerbsServer() {
	die := func(err error) {
		fmt.Fprintln(os.Stderr, "rc_verbs server child:", err)
		os.Exit(1)
	}
	lc := rdmanet.ListenConfig{Config: cfg("rc_verbs")}
	lis := func() net.Listener {
		l, err := lc.Listen(context.Background(), "rdma", net.JoinHostPort(rxeIP(), "0"))
		if err != nil {
			die(err)
		}
		return l
	}
	echo, grpcL, grpcsL := lis(), lis(), lis()
	tcpL, err := net.Listen("tcp", net.JoinHostPort(rxeIP(), "0"))
	if err != nil {
		die(err)
	}
	go serveEcho(echo)
	go serveEcho(tcpL)
	g := grpc.NewServer()
	healthpb.RegisterHealthServer(g, health.NewServer())
	go g.Serve(grpcL)
	cert, err := tls.X509KeyPair([]byte(os.Getenv("TEST_CERT")), []byte(os.Getenv("TEST_KEY")))
	if err != nil {
		die(err)
	}
	gs := grpc.NewServer(grpc.Creds(credentials.NewServerTLSFromCert(&cert)))
	healthpb.RegisterHealthServer(gs, health.NewServer())
	go gs.Serve(grpcsL)
	b, _ := json.Marshal(serverAddrs{Echo: echo.Addr().String(), TCP: tcpL.Addr().String(),
		GRPC: grpcL.Addr().String(), GRPCS: grpcsL.Addr().String()})
	fmt.Println(string(b))
	io.Copy(io.Discard, os.Stdin)
}

// startRCServer starts an rcVerbsServer child, stopped at the end of the test.
func startRCServer(t testing.TB) *peer {
	t.Helper()
	return startServerAs(t, rcServerRole)
}

// TestRCVerbsTwoProcess: echo integrity and gRPC (plain and TLS) between
// two processes over rc_verbs.
func TestRCVerbsTwoProcess(t *testing.T) {
	c := rcVerbsConfig(t)
	p := startRCServer(t)
	t.Run("echo", func(t *testing.T) {
		conn := dialEchoRC(t, "rdma", p.addrs.Echo, c, 'E')
		defer conn.Close()
		echoCheck(t, conn, integrityBytes()/4)
	})
	_, pool := testCert(t)
	tlsCreds := credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	t.Run("grpc", func(t *testing.T) { grpcOverRC(t, p.addrs.GRPC, c, insecure.NewCredentials()) })
	t.Run("grpc/tls", func(t *testing.T) { grpcOverRC(t, p.addrs.GRPCS, c, tlsCreds) })
}

// grpcOverRC runs health Check and Watch on addr through rdmanet with c and
// checks that every conn gRPC dialed runs on rc_verbs.
func grpcOverRC(t *testing.T, addr string, c *rdmanet.Config, creds credentials.TransportCredentials) {
	d := &rdmanet.Dialer{Config: c, Timeout: 10 * time.Second}
	got := grpcHealth(t, addr, d, creds, 50, 30*time.Second)
	if len(got) == 0 {
		t.Fatal("gRPC dialed no conn")
	}
	for _, tr := range got {
		if !strings.HasPrefix(tr, "rc_verbs/") {
			t.Errorf("gRPC conn on %q, want rc_verbs/<dev>", tr)
		}
	}
}

// dialEchoRC connects to a serveEcho listener like dialEcho, checking that
// both sides run on the same rc_verbs device (network "rdma") or on TCP.
func dialEchoRC(t testing.TB, network, addr string, c *rdmanet.Config, mode byte) net.Conn {
	t.Helper()
	want := "tcp"
	if network == "rdma" {
		want = "rc_verbs/"
	}
	return dialEchoAs(t, network, addr, c, mode, want+" on both", func(tr string) bool { return strings.HasPrefix(tr, want) })
}
