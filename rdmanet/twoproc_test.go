package rdmanet_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/gouct/gouct/dialer"
	"github.com/gouct/gouct/rdmanet"
)

// wantTwoProc is the transport two processes of this host end on by default.
const wantTwoProc = "shm"

func skipIfForced(t testing.TB) {
	if envTLS() != "" {
		t.Skipf("RDMANET_TLS=%s overrides the default", envTLS())
	}
}

// integrityBytes per direction for the echo check (RDMANET_TEST_BYTES to raise it).
func integrityBytes() int {
	if s := os.Getenv("RDMANET_TEST_BYTES"); s != "" {
		if n, err := strconv.Atoi(s); err == nil {
			return n
		}
	}
	return 16 << 20
}

// echoCheck writes total bytes in random sizes crossing every stream
// threshold while reading the echo concurrently, and compares checksums.
func echoCheck(t *testing.T, c net.Conn, total int) {
	t.Helper()
	sizes := []int{1, 7, 64, 1000, 2048, 4096, 8191, 8192, 8193, 65536, 200000, 1 << 20, 3 << 20}
	src := make([]byte, 3<<20+17)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	var wsum [32]byte
	werr := make(chan error, 1)
	go func() {
		h := sha256.New()
		left := total
		for left > 0 {
			n := min(sizes[rng.IntN(len(sizes))], left)
			off := rng.IntN(len(src) - n + 1)
			p := src[off : off+n]
			h.Write(p)
			if _, err := c.Write(p); err != nil {
				werr <- err
				return
			}
			left -= n
		}
		copy(wsum[:], h.Sum(nil))
		werr <- c.(interface{ CloseWrite() error }).CloseWrite()
	}()
	h := sha256.New()
	n, err := io.CopyBuffer(h, struct{ io.Reader }{c}, make([]byte, 100000))
	if err != nil {
		var w error
		select {
		case w = <-werr:
		case <-time.After(time.Second):
		}
		st := rdmanet.Stats{}
		if rc, ok := c.(rdmanet.Conn); ok {
			st = rc.Stats()
		}
		t.Fatalf("read echo after %d bytes: %v (writer: %v; stats %+v)", n, err, w, st)
	}
	if err := <-werr; err != nil {
		t.Fatalf("write: %v", err)
	}
	if n != int64(total) {
		t.Fatalf("echoed %d bytes, want %d", n, total)
	}
	if !bytes.Equal(h.Sum(nil), wsum[:]) {
		t.Fatalf("checksum mismatch over %d bytes", total)
	}
}

func shmEntries(t testing.TB) []string {
	ents, _ := os.ReadDir("/dev/shm")
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func checkShmClean(t *testing.T) {
	before := shmEntries(t)
	t.Cleanup(func() {
		for _, e := range shmEntries(t) {
			if !slices.Contains(before, e) {
				t.Errorf("left behind: %s", filepath.Join("/dev/shm", e))
			}
		}
	})
}

func TestTwoProcessEcho(t *testing.T) {
	skipIfForced(t)
	checkShmClean(t)
	p := startServer(t)
	t.Run("default", func(t *testing.T) {
		c := dialEcho(t, "rdma", p.addrs.Echo, nil, 'E', wantTwoProc)
		defer c.Close()
		echoCheck(t, c, integrityBytes())
	})
	t.Run("tcp", func(t *testing.T) {
		c := dialEcho(t, "rdma", p.addrs.Echo, cfg("tcp"), 'E', "tcp")
		defer c.Close()
		echoCheck(t, c, integrityBytes()/4)
	})
	t.Run("self is not offered across processes", func(t *testing.T) {
		d := rdmanet.Dialer{Config: cfg("self")}
		c, err := d.Dial("rdma", p.addrs.Echo)
		if err == nil {
			c.Close()
			t.Fatal("self between two processes: dial succeeded")
		}
		if !errors.Is(err, rdmanet.ErrNoTransport) {
			t.Fatalf("err = %v, want ErrNoTransport", err)
		}
		t.Log(err)
	})
}

// TestPeerKill: the peer process dies mid-stream; the survivor's blocked Read
// fails within 1 s, its listener keeps serving, nothing is left in /dev/shm.
func TestPeerKill(t *testing.T) {
	skipIfForced(t)
	checkShmClean(t)
	l := listen(t, nil)
	defer l.Close()
	for round := 0; round < 2; round++ {
		cmd := startChild(t, "client", "TEST_ADDR="+l.Addr().String())
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		c, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		if got := transportOf(t, c); got != wantTwoProc {
			t.Errorf("round %d: transport %q, want %q", round, got, wantTwoProc)
		}
		buf := make([]byte, 64<<10)
		if _, err := io.ReadFull(c, buf); err != nil { // the stream is flowing
			t.Fatal(err)
		}
		var killed time.Time
		errc := make(chan error, 1)
		go func() {
			for {
				if _, err := c.Read(buf); err != nil {
					errc <- err
					return
				}
			}
		}()
		time.Sleep(50 * time.Millisecond)
		killed = time.Now()
		cmd.Process.Signal(syscall.SIGKILL)
		select {
		case err := <-errc:
			d := time.Since(killed)
			t.Logf("round %d: Read failed %v after SIGKILL: %v", round, d.Round(time.Millisecond), err)
			if d > time.Second {
				t.Errorf("Read failed only after %v", d)
			}
			if err == io.EOF {
				t.Errorf("a killed peer reads as a clean EOF")
			}
		case <-time.After(3 * time.Second):
			t.Fatalf("round %d: Read still blocked 3 s after the peer's SIGKILL", round)
		}
		c.Close()
		<-done
	}
}

func TestGRPC(t *testing.T) {
	cert, pool := testCert(t)
	check := func(t *testing.T, addr string, d *rdmanet.Dialer, creds credentials.TransportCredentials, want string) {
		if got := grpcHealth(t, addr, d, creds, 20, 10*time.Second); len(got) == 0 || got[0] != want {
			t.Errorf("grpc conns on %v, want %s", got, want)
		}
	}
	tlsCreds := credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	for _, tl := range []string{"self", "tcp"} {
		for _, secure := range []bool{false, true} {
			name := tl
			if secure {
				name += "/tls"
			}
			t.Run(name, func(t *testing.T) {
				l := listen(t, cfg(tl))
				var opts []grpc.ServerOption
				creds := insecure.NewCredentials()
				if secure {
					opts = append(opts, grpc.Creds(credentials.NewServerTLSFromCert(&cert)))
					creds = tlsCreds
				}
				s := grpc.NewServer(opts...)
				healthpb.RegisterHealthServer(s, health.NewServer())
				go s.Serve(l)
				defer s.Stop()
				check(t, l.Addr().String(), &rdmanet.Dialer{Config: cfg(tl)}, creds, tl)
			})
		}
	}
	t.Run("two processes", func(t *testing.T) {
		skipIfForced(t)
		p := startServer(t)
		t.Run("plain", func(t *testing.T) {
			check(t, p.addrs.GRPC, &rdmanet.Dialer{}, insecure.NewCredentials(), wantTwoProc)
		})
		t.Run("tls", func(t *testing.T) {
			check(t, p.addrs.GRPCS, &rdmanet.Dialer{}, tlsCreds, wantTwoProc)
		})
		t.Run("grpc helper", func(t *testing.T) {
			cc, err := grpc.NewClient("passthrough:///"+p.addrs.GRPC, grpc.WithContextDialer(dialer.GRPC()),
				grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			if _, err := healthpb.NewHealthClient(cc).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
				t.Fatal(err)
			}
		})
	})
}

func TestHTTP(t *testing.T) {
	get := func(t *testing.T, tr *http.Transport, url, want string) {
		defer tr.CloseIdleConnections()
		cl := &http.Client{Transport: tr, Timeout: 10 * time.Second}
		body := strings.Repeat("rdmanet ", 100000)
		for i := 0; i < 3; i++ {
			resp, err := cl.Post(url, "text/plain", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || string(b) != body {
				t.Fatalf("echo of %d bytes: got %d, %v", len(body), len(b), err)
			}
			if got := resp.Header.Get("X-Transport"); got != want {
				t.Fatalf("server conn on %q, want %q", got, want)
			}
		}
	}
	for _, tl := range []string{"self", "tcp"} {
		t.Run(tl, func(t *testing.T) {
			l := listen(t, cfg(tl))
			s := serveHTTP(l)
			defer s.Close()
			d := &rdmanet.Dialer{Config: cfg(tl)}
			get(t, d.HTTPTransport(), "http://"+l.Addr().String()+"/", tl)
		})
	}
	t.Run("two processes", func(t *testing.T) {
		skipIfForced(t)
		p := startServer(t)
		get(t, rdmanet.HTTPTransport(), "http://"+p.addrs.HTTP+"/", wantTwoProc)
	})
}
