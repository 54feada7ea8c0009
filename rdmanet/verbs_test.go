package rdmanet_test

import (
	"net"
	"strings"
	"testing"

	"golang.org/x/net/nettest"

	"github.com/gouct/gouct/internal/rt"
	"github.com/gouct/gouct/rdmanet"
)

// TestRCVerbs forces rc_verbs (connect-to-EP wireup: the client's
// unconnected EP address in Hello, the server's in Reply) inside one
// process. It skips on hosts without an RDMA port and fails in the
// Soft-RoCE VM (RXEVM=1) when rc_verbs is missing.
func TestRCVerbs(t *testing.T) {
	c := rcVerbsConfig(t)
	t.Run("nettest", func(t *testing.T) {
		nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) {
			l := listen(t, c)
			c1, c2, err := pipe(l, c)
			if err != nil {
				return nil, nil, nil, err
			}
			for _, x := range []net.Conn{c1, c2} {
				if tr := x.(rdmanet.Conn).Transport(); !strings.HasPrefix(tr, "rc_verbs/") {
					t.Errorf("transport %q, want rc_verbs/<dev>", tr)
				}
			}
			return c1, c2, func() { c1.Close(); c2.Close(); l.Close() }, nil
		})
	})
	t.Run("echo", func(t *testing.T) {
		l := listen(t, c)
		defer l.Close()
		go serveEcho(l)
		conn := dialEcho(t, "rdma", l.Addr().String(), c, 'E', transportName(t, c))
		defer conn.Close()
		echoCheck(t, conn, integrityBytes()/4)
	})
}

func transportName(t *testing.T, c *rdmanet.Config) string {
	resolved, _ := rt.Resolve(c)
	return rt.Get(resolved).Allowed(resolved)[0].Name()
}
