package rdmanet_test

import (
	"io"
	"maps"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gouct/gouct/internal/rt"
	"github.com/gouct/gouct/rdmanet"
	"github.com/gouct/gouct/uct/ib"
)

// The rc_verbs device follows the bootstrap IP (RoCE routes by IP): on the
// VM's three Soft-RoCE devices (scripts/rxevm/run-in-rxe-vm.sh --veth: rxe0
// on 10.77.0.1, rxe1 on 10.78.0.1 <-> rxe2 on 10.78.0.2 across a veth pair),
// a conn whose bootstrap runs between two IPs runs on the device of each
// side's IP. Skips without those devices; fails under RXEVM=1.

// rxeTopology is the VM's device of each IP.
var rxeTopology = map[string]string{"10.77.0.1": "rxe0:1", "10.78.0.1": "rxe1:1", "10.78.0.2": "rxe2:1"}

// needRXETopology skips (fails under RXEVM=1) unless every rxeTopology
// device is open for c and its IP is local.
func needRXETopology(t *testing.T, c *rdmanet.Config) {
	t.Helper()
	miss := func(format string, args ...any) {
		t.Helper()
		if os.Getenv("RXEVM") == "1" {
			t.Fatalf(format+" (run-in-rxe-vm.sh --veth)", args...)
		}
		t.Skipf(format, args...)
	}
	resolved, err := rt.Resolve(c)
	if err != nil {
		t.Fatal(err)
	}
	open := map[string]bool{}
	for _, tr := range rt.Get(resolved).Allowed(resolved) {
		open[tr.Name()] = true
	}
	for ip, dev := range rxeTopology {
		if !open["rc_verbs/"+dev] {
			miss("rc_verbs/%s not open (open: %v)", dev, open)
		}
		l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			miss("%s is not a local IP: %v", ip, err)
		}
		l.Close()
	}
}

// linkLocal returns the IPv6 link-local address and netdev of the netdev
// that has the IP v4, or fails the test.
func linkLocal(t *testing.T, v4 string) (net.IP, string) {
	t.Helper()
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, ifc := range ifs {
		addrs, _ := ifc.Addrs()
		var has bool
		var ll net.IP
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				has = has || n.IP.Equal(net.ParseIP(v4))
				if n.IP.IsLinkLocalUnicast() && n.IP.To4() == nil {
					ll = n.IP
				}
			}
		}
		if has && ll != nil {
			return ll, ifc.Name
		}
	}
	t.Fatalf("no IPv6 link-local address beside %s", v4)
	return nil, ""
}

// TestRCVerbsDeviceForBootstrapIP: for each (listen IP, client IP) pair the
// server's conn runs on the listen IP's device and the client's on the
// client IP's device (Transport and Stats say so on both ends), and echo is
// intact. Before the wireup followed the bootstrap IP, every pair ran on
// rxe0 (the first device reaching a candidate).
func TestRCVerbsDeviceForBootstrapIP(t *testing.T) {
	c := rcVerbsConfig(t)
	needRXETopology(t, c)
	devs := maps.Clone(rxeTopology)
	// rxe1's netdev also has an IPv6 link-local address, a GID of rxe1 too:
	// a bootstrap on it runs the QPs on that GID (ib.UseGIDForIP), not on
	// the port's IPv4 one.
	ll, zone := linkLocal(t, "10.78.0.1")
	devs[ll.String()] = "rxe1:1"
	llz := ll.String() + "%" + zone
	// What each handshake side pays to find the device (ib.ResourceForIP
	// scans every RDMA device's GID table).
	for ip, want := range devs {
		start := time.Now()
		dev, idx, err := ib.ResourceForIP(net.ParseIP(ip))
		if err != nil || dev != want {
			t.Fatalf("ib.ResourceForIP(%s) = %q, %d, %v; want %s", ip, dev, idx, err, want)
		}
		t.Logf("ib.ResourceForIP(%s) = %s GID index %d in %v", ip, dev, idx, time.Since(start))
	}
	for _, tc := range []struct {
		name             string
		server, client   string // IPs; client "" lets the kernel choose
		wantSrv, wantCli string // devices; wantCli "" is the device of the IP the kernel chose
	}{
		{"rxe0", "10.77.0.1", "", "rxe0:1", ""},
		{"rxe1<-rxe2", "10.78.0.1", "10.78.0.2", "rxe1:1", "rxe2:1"},
		{"rxe2<-rxe1", "10.78.0.2", "10.78.0.1", "rxe2:1", "rxe1:1"},
		{"rxe1", "10.78.0.1", "10.78.0.1", "rxe1:1", "rxe1:1"},
		{"rxe2", "10.78.0.2", "10.78.0.2", "rxe2:1", "rxe2:1"},
		{"rxe1/ipv6", llz, llz, "rxe1:1", "rxe1:1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lc := rdmanet.ListenConfig{Config: c}
			l, err := lc.Listen(t.Context(), "rdma", net.JoinHostPort(tc.server, "0"))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			go serveEcho(l)
			d := rdmanet.Dialer{Config: c, Timeout: 20 * time.Second}
			if tc.client != "" {
				ip, zone, _ := strings.Cut(tc.client, "%")
				d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(ip), Zone: zone}
			}
			conn, err := d.DialContext(t.Context(), "rdma", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			// The bootstrap's local address says which device the client
			// should use (the kernel picks it when unbound).
			la, err := net.ResolveTCPAddr("tcp", conn.LocalAddr().String())
			if err != nil {
				t.Fatal(err)
			}
			wantCli := tc.wantCli
			if wantCli == "" {
				if wantCli = devs[la.IP.String()]; wantCli == "" {
					t.Fatalf("bootstrap from %v: no device has that IP", la)
				}
			} else if got := devs[la.IP.String()]; got != wantCli {
				t.Fatalf("bootstrap from %v (device %q), want the IP of %s", la, got, wantCli)
			}
			var n [1]byte
			if _, err := io.ReadFull(conn, n[:]); err != nil {
				t.Fatal(err)
			}
			srv := make([]byte, n[0])
			if _, err := io.ReadFull(conn, srv); err != nil {
				t.Fatal(err)
			}
			rc := conn.(rdmanet.Conn)
			cli, st := rc.Transport(), rc.Stats().Transport
			if string(srv) != "rc_verbs/"+tc.wantSrv || cli != "rc_verbs/"+wantCli || st != cli {
				t.Fatalf("bootstrap %v -> %v: server on %q, client on %q (stats %q); want rc_verbs/%s and rc_verbs/%s",
					conn.LocalAddr(), conn.RemoteAddr(), srv, cli, st, tc.wantSrv, wantCli)
			}
			t.Logf("bootstrap %v -> %v: client rc_verbs/%s, server rc_verbs/%s", conn.LocalAddr(), conn.RemoteAddr(), wantCli, tc.wantSrv)
			if _, err := conn.Write([]byte{'E'}); err != nil {
				t.Fatal(err)
			}
			echoCheck(t, conn, integrityBytes()/64)
		})
	}
}
