// Package demo_test runs the grpc-over-rdma example as `make demo` does: the
// server and client binaries as two processes, over each transport, with and
// without TLS.
package demo_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func build(t *testing.T, dir string) {
	t.Helper()
	cmd := exec.Command("go", "build", "-o", dir+"/", "./server", "./client")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func TestDemoTwoProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs two binaries")
	}
	bin := t.TempDir()
	build(t, bin)
	for _, tc := range []struct {
		name, transport string
		tls             bool
		want            string
	}{
		{"default", "", false, "transport shm"},
		{"default-tls", "", true, "transport shm"},
		{"tcp", "tcp", false, "transport tcp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port := freePort(t)
			cert := filepath.Join(t.TempDir(), "cert.pem")
			args := []string{"-addr", fmt.Sprintf("127.0.0.1:%d", port), "-cert", cert}
			if tc.tls {
				args = append(args, "-tls")
			}
			if tc.transport != "" {
				args = append(args, "-transport", tc.transport)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			srv := exec.CommandContext(ctx, filepath.Join(bin, "server"), args...)
			srv.Stderr = os.Stderr
			out, err := srv.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := srv.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { srv.Process.Kill(); srv.Wait() }()
			line, err := bufio.NewReader(out).ReadString('\n')
			if err != nil || !strings.HasPrefix(line, "ready") {
				t.Fatalf("server did not start: %q %v", line, err)
			}
			cli := exec.CommandContext(ctx, filepath.Join(bin, "client"),
				append(args, "-n", "300", "-stream-bytes", fmt.Sprint(32<<20))...)
			got, err := cli.CombinedOutput()
			if err != nil {
				t.Fatalf("client: %v\n%s", err, got)
			}
			t.Logf("\n%s", got)
			if !strings.Contains(string(got), tc.want) || !strings.Contains(string(got), "stream 1024 KiB chunks") {
				t.Fatalf("client output lacks %q:\n%s", tc.want, got)
			}
		})
	}
}
