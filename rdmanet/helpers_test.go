package rdmanet_test

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/gouct/gouct/rdmanet"
)

func envTLS() string { return os.Getenv("RDMANET_TLS") }

const childEnv = "GOUCT_RDMANET_TEST_CHILD"

// childMain runs the peer side of two-process tests when the test binary is
// re-executed as one (childEnv set); it reports whether it did.
func childMain() bool {
	switch os.Getenv(childEnv) {
	case "":
		return false
	case "server":
		childServer()
	case "client":
		childClient()
	default:
		role, ok := childRoles[os.Getenv(childEnv)]
		if !ok {
			fmt.Fprintln(os.Stderr, "unknown child role")
			os.Exit(2)
		}
		role()
	}
	os.Exit(0)
	return true
}

// serverAddrs is what the server child prints on its first stdout line.
type serverAddrs struct {
	Echo, TCP, GRPC, GRPCS, HTTP string
}

// childServer serves echo (rdmanet and plain TCP), gRPC health (plain and
// TLS) and HTTP over rdmanet, until its stdin closes.
func childServer() {
	die := func(err error) {
		fmt.Fprintln(os.Stderr, "child server:", err)
		os.Exit(1)
	}
	lis := func() net.Listener {
		l, err := rdmanet.Listen("rdma", "127.0.0.1:0")
		if err != nil {
			die(err)
		}
		return l
	}
	echo, grpcL, grpcsL, httpL := lis(), lis(), lis(), lis()
	tcpL, err := net.Listen("tcp", "127.0.0.1:0")
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
	serveHTTP(httpL)
	b, _ := json.Marshal(serverAddrs{Echo: echo.Addr().String(), TCP: tcpL.Addr().String(),
		GRPC: grpcL.Addr().String(), GRPCS: grpcsL.Addr().String(), HTTP: httpL.Addr().String()})
	fmt.Println(string(b))
	io.Copy(io.Discard, os.Stdin)
}

// childClient dials RDMANET_TEST_ADDR and writes until killed.
func childClient() {
	c, err := rdmanet.Dial("rdma", os.Getenv("TEST_ADDR"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child client:", err)
		os.Exit(1)
	}
	buf := make([]byte, 64<<10)
	for {
		if _, err := c.Write(buf); err != nil {
			os.Exit(1)
		}
	}
}

// serveEcho: each conn first receives its transport name ([len][name]),
// then a mode byte: 'E' echoes until EOF (1 MiB reads: writes of every
// size); 'e' the same with 16 KiB reads (many conns); 'S' reads an 8-byte
// count, drains that many bytes and answers one byte.
func serveEcho(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			if os.Getenv("GOUCT_DEBUG") != "" {
				defer func() {
					if rc, ok := c.(rdmanet.Conn); ok {
						fmt.Fprintf(os.Stderr, "serveEcho: conn done: %+v\n", rc.Stats())
					}
				}()
			}
			name := "tcp"
			if rc, ok := c.(rdmanet.Conn); ok {
				name = rc.Transport()
			}
			if _, err := c.Write(append([]byte{byte(len(name))}, name...)); err != nil {
				return
			}
			var mode [1]byte
			if _, err := io.ReadFull(c, mode[:]); err != nil {
				return
			}
			size := 1 << 20
			if mode[0] == 'e' {
				size = 16 << 10
			}
			buf := make([]byte, size)
			switch mode[0] {
			case 'E', 'e':
				for {
					n, err := c.Read(buf)
					if n > 0 {
						if _, werr := c.Write(buf[:n]); werr != nil {
							fmt.Fprintln(os.Stderr, "serveEcho: write:", werr)
							return
						}
					}
					if err != nil {
						if err != io.EOF {
							fmt.Fprintln(os.Stderr, "serveEcho: read:", err)
						}
						if cw, ok := c.(interface{ CloseWrite() error }); ok {
							cw.CloseWrite()
						}
						return
					}
				}
			case 'S':
				for {
					var cnt [8]byte
					if _, err := io.ReadFull(c, cnt[:]); err != nil {
						return
					}
					left := int64(binary.LittleEndian.Uint64(cnt[:]))
					for left > 0 {
						n, err := c.Read(buf[:min(int64(len(buf)), left)])
						left -= int64(n)
						if err != nil {
							return
						}
					}
					if _, err := c.Write([]byte{1}); err != nil {
						return
					}
				}
			}
		}()
	}
}

type ctxKey struct{}

func httpHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if name, ok := r.Context().Value(ctxKey{}).(string); ok {
			w.Header().Set("X-Transport", name)
		}
		io.Copy(w, r.Body)
	})
}

// serveHTTP serves httpHandler on l, with the conn's transport in X-Transport.
func serveHTTP(l net.Listener) *http.Server {
	s := &http.Server{Handler: httpHandler(), ConnContext: func(ctx context.Context, c net.Conn) context.Context {
		if rc, ok := c.(rdmanet.Conn); ok {
			return context.WithValue(ctx, ctxKey{}, rc.Transport())
		}
		return ctx
	}}
	go s.Serve(l)
	return s
}

// peer is a running server child.
type peer struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	addrs serverAddrs
	done  chan error
}

var (
	certOnce        sync.Once
	certPEM, keyPEM []byte
	certPool        *x509.CertPool
)

// testCert is a self-signed certificate for 127.0.0.1, made once per run.
func testCert(t testing.TB) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	certOnce.Do(func() {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			panic(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "rdmanet test"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			panic(err)
		}
		kb, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			panic(err)
		}
		certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		keyPEM = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
		certPool = x509.NewCertPool()
		certPool.AppendCertsFromPEM(certPEM)
	})
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return cert, certPool
}

// startChild re-executes the test binary as role with extra environment.
func startChild(t testing.TB, role string, env ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childEnv+"="+role), env...)
	cmd.Stderr = os.Stderr
	return cmd
}

// startServer starts a server child (default configuration: ends on shm
// with this process) and stops it at the end of the test.
func startServer(t testing.TB) *peer {
	t.Helper()
	return startServerAs(t, "server")
}

// startServerAs starts a server child in role, which prints its addresses
// as one JSON line and serves until its stdin closes; it is stopped at the
// end of the test.
func startServerAs(t testing.TB, role string) *peer {
	t.Helper()
	testCert(t)
	cmd := startChild(t, role, "TEST_CERT="+string(certPEM), "TEST_KEY="+string(keyPEM))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &peer{cmd: cmd, stdin: stdin, done: make(chan error, 1)}
	line, err := bufio.NewReader(out).ReadBytes('\n')
	if err == nil {
		err = json.Unmarshal(line, &p.addrs)
	}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-p.done
		}
	})
	if err != nil {
		t.Fatalf("%s child: %v (%q)", role, err, line)
	}
	return p
}

// dialEcho connects to a serveEcho listener, checks the transport both
// sides report and sends the mode byte.
func dialEcho(t testing.TB, network, addr string, c *rdmanet.Config, mode byte, want string) net.Conn {
	t.Helper()
	return dialEchoAs(t, network, addr, c, mode, fmt.Sprintf("%q", want), func(tr string) bool { return tr == want })
}

// dialEchoAs is dialEcho with the check of the transport (which both sides
// must report alike) given as ok, described by wantDesc.
func dialEchoAs(t testing.TB, network, addr string, c *rdmanet.Config, mode byte, wantDesc string, ok func(string) bool) net.Conn {
	t.Helper()
	var conn net.Conn
	var err error
	if network == "tcp" {
		conn, err = net.Dial("tcp", addr)
	} else {
		d := rdmanet.Dialer{Config: c, Timeout: 10 * time.Second}
		conn, err = d.Dial("rdma", addr)
	}
	if err != nil {
		t.Fatal(err)
	}
	var n [1]byte
	if _, err := io.ReadFull(conn, n[:]); err != nil {
		t.Fatal(err)
	}
	name := make([]byte, n[0])
	if _, err := io.ReadFull(conn, name); err != nil {
		t.Fatal(err)
	}
	local := "tcp"
	if rc, ok := conn.(rdmanet.Conn); ok {
		local = rc.Transport()
	}
	if string(name) != local || !ok(local) {
		t.Fatalf("transport: server %q, client %q; want %s", name, local, wantDesc)
	}
	if _, err := conn.Write([]byte{mode}); err != nil {
		t.Fatal(err)
	}
	return conn
}

// grpcHealth runs n health Checks and one Watch on addr, dialing through d,
// within timeout, and returns the transports of the conns gRPC dialed.
func grpcHealth(t *testing.T, addr string, d *rdmanet.Dialer, creds credentials.TransportCredentials, n int, timeout time.Duration) []string {
	t.Helper()
	var mu sync.Mutex
	var got []string
	dial := func(ctx context.Context, a string) (net.Conn, error) {
		c, err := d.DialContext(ctx, "rdma", a)
		if err == nil {
			mu.Lock()
			got = append(got, c.(rdmanet.Conn).Transport())
			mu.Unlock()
		}
		return c, err
	}
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithContextDialer(dial), grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for i := 0; i < n; i++ {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatalf("check %d: %v", i, err)
		}
		if r.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("status %v", r.Status)
		}
	}
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := w.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("watch: %v, %v", r, err)
	}
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(got)
}
