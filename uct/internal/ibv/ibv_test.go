//go:build linux && cgo && !noverbs

package ibv

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
)

// A missing library is an error naming it, not a crash.
func TestLoadMissingLibrary(t *testing.T) {
	err := load("libibverbs-does-not-exist.so.1")
	if err == nil || !strings.HasPrefix(err.Error(), "libibverbs not found: ") {
		t.Fatalf("load of a missing library: %v", err)
	}
	t.Log(err)
}

// On a host without kernel RDMA the device list fails with ENOSYS; in the
// VM (RXEVM=1) it lists the rxe devices.
func TestDeviceNames(t *testing.T) {
	if err := Load(); err != nil {
		if os.Getenv("RXEVM") == "1" {
			t.Fatal(err)
		}
		t.Skipf("libibverbs: %v", err)
	}
	names, err := DeviceNames()
	if os.Getenv("RXEVM") != "1" {
		if err != nil && !errors.Is(err, syscall.ENOSYS) {
			t.Logf("device list: %v", err)
		}
		return
	}
	if err != nil || len(names) == 0 {
		t.Fatalf("in the VM: %v %v", names, err)
	}
	t.Logf("devices %v, fork status %d", names, ForkStatus())
	ctx, err := Open(names[0])
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	gids, err := ctx.GIDs(1)
	if err != nil || len(gids) == 0 {
		t.Fatalf("GIDs: %v %v", gids, err)
	}
	for _, g := range gids {
		t.Logf("gid %d type %d ifindex %d %x", g.Index, g.Type, g.IfIndex, g.GID)
	}
	if _, err := Open("nosuchdev0"); err == nil {
		t.Error("open of a missing device: no error")
	}
}
